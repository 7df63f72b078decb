"""ddp_fetch (the train role's action plugin): a node's archive to the controller over the connection alone,
kept only when it arrives with the sha256 the node runner reported, and removed on the node when asked."""

import hashlib
from pathlib import Path

import yaml
from _playbooks import LOCAL_HOST, ROOT, write_inventory


def fetch_play(tmp_path: Path, task: dict) -> Path:
    """A playbook beside a link to the role's action plugins (Ansible loads the plugins beside a playbook)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "action_plugins").symlink_to(ROOT / "ansible/roles/train/action_plugins")
    play = [{"name": "Fetch", "hosts": "node0", "gather_facts": False, "tasks": [{"name": "Fetch it", **task}]}]
    (tmp_path / "fetch.yml").write_text(yaml.safe_dump(play))
    return tmp_path / "fetch.yml"


def test_the_file_arrives_whole_and_the_node_keeps_its_copy_unless_asked(tmp_path, playbook):
    src = tmp_path / "node" / "collected.tar"
    src.parent.mkdir()
    src.write_bytes(b"archive" * 1000)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "artifacts" / "run" / "collected.tar"
    inventory = write_inventory(tmp_path / "inventory", {"node0": LOCAL_HOST}, {"training": ["node0"]})
    # "no" as a templated variable may arrive: a string, which is no request to remove.
    for remove, removed in ((False, False), ("no", False), (True, True)):
        task = {"ddp_fetch": {"src": str(src), "dest": str(dest), "sha256": digest, "remove": remove}}
        run = playbook(fetch_play(tmp_path / f"play-{remove}", task), inventory)
        assert run.rc == 0, run.output
        assert dest.read_bytes() == b"archive" * 1000
        assert src.exists() != removed
    assert sorted(path.name for path in dest.parent.iterdir()) == ["collected.tar"]  # no part file left


def test_a_file_that_differs_from_what_the_node_wrote_is_not_kept(tmp_path, playbook):
    src = tmp_path / "collected.tar"
    src.write_bytes(b"cut short")
    dest = tmp_path / "artifacts" / "collected.tar"
    inventory = write_inventory(tmp_path / "inventory", {"node0": LOCAL_HOST}, {"training": ["node0"]})
    wrote = hashlib.sha256(b"the whole archive").hexdigest()
    task = {"ddp_fetch": {"src": str(src), "dest": str(dest), "sha256": wrote, "remove": True}}
    run = playbook(fetch_play(tmp_path, task), inventory)
    assert run.rc != 0
    [failure] = [e["event_data"]["res"]["msg"] for e in run.events if e["event"] == "runner_on_failed"]
    arrived = hashlib.sha256(b"cut short").hexdigest()
    assert (
        failure == f"{src} arrived from node0 with sha256 {arrived}, not the {wrote} the node wrote: nothing was kept"
    )
    assert list(dest.parent.iterdir()) == []
    assert src.exists(), "the node's copy went although none arrived whole"


def test_an_unknown_argument_is_refused_naming_what_it_takes(tmp_path, playbook):
    inventory = write_inventory(tmp_path / "inventory", {"node0": LOCAL_HOST}, {"training": ["node0"]})
    task = {"ddp_fetch": {"src": "/x", "dest": str(tmp_path / "y"), "sha256": "0", "flat": True}}
    run = playbook(fetch_play(tmp_path, task), inventory)
    [failure] = [e["event_data"]["res"]["msg"] for e in run.events if e["event"] == "runner_on_failed"]
    assert failure == "ddp_fetch takes src, dest, sha256 and remove; got ['dest', 'flat', 'sha256', 'src']"
