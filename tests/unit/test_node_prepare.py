"""The preflight's one call per node (ansible/roles/train/files/ddp_prepare.py): run as the play runs it, a process
per node, master and peers at once on loopback."""

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _modules import ROOT, load

PREPARE = ROOT / "ansible/roles/train/files/ddp_prepare.py"
ddp_prepare = load("ddp_prepare", PREPARE)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def peer_of(port: int, timeout: float = 10) -> dict:
    return {"rendezvous": {"port": port, "timeout": timeout, "master_addr": "127.0.0.1"}}


def node_spec(tmp_path: Path, node: str, port: int, nnodes: int = 2, **extra) -> dict:
    """What the play sends a node of an nnodes-node run on host runtime; the master is node0."""
    master = node == "node0"
    spec = {
        "node": node,
        "user": "job",
        "runtime": "host",
        "venv": str(tmp_path / "venv"),
        "run_id": "job-1",
        "run_node_dir": str(tmp_path / "nodes" / node / "job-1"),
        "master": "node0",
        "nnodes": nnodes,
        "required_files": [],
        "rendezvous": {"port": port, "timeout": 10}
        | ({"peers": nnodes - 1} if master else {"master_addr": "127.0.0.1"}),
        "master_dirs": [str(tmp_path / "shared" / d) for d in ("checkpoints", "output", "work")] if master else [],
        "writable_dirs": [str(tmp_path / "shared" / d) for d in ("checkpoints", "output")],
    }
    if nnodes > 1:
        spec["shared_dir"] = str(tmp_path / "shared" / "checkpoints")
    return spec | extra


def start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PREPARE), json.dumps(spec)], stdout=subprocess.PIPE, text=True)


def report_of(process: subprocess.Popen) -> dict:
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    report = json.loads(stdout)
    assert report["kind"] == "ddp_node.prepare/1"
    return report


def test_master_and_peer_pass_and_leave_only_the_directories(tmp_path):
    port = free_port()
    # The peer starts first: it waits for the master's directories behind the rendezvous connection.
    peer = start(node_spec(tmp_path, "node1", port))
    master = start(node_spec(tmp_path, "node0", port))
    assert report_of(master)["problems"] == []
    assert report_of(peer)["problems"] == []
    shared = tmp_path / "shared"
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoints", "output", "work"]
    assert [p for p in shared.rglob("*") if p.is_file()] == []  # every marker removed
    assert (tmp_path / "nodes/node1/job-1").is_dir()


def test_a_run_id_used_before_is_refused_on_any_node_that_has_its_directories(tmp_path):
    spec = node_spec(tmp_path, "node0", free_port(), nnodes=1, fresh_dirs=[str(tmp_path / "shared/output")])
    assert report_of(start(spec))["problems"] == []
    # The same id again, from a controller that kept no record of it: the node's run dir and the run's shared
    # directory both say it was used.
    assert report_of(start(spec | {"rendezvous": {"port": free_port(), "timeout": 10, "peers": 0}}))["problems"] == [
        f"run id job-1 was used before: {tmp_path / 'nodes/node0/job-1'} exists on node0, and a reused id would mix "
        "two runs' files. Leave train_run_id empty for a fresh one.",
        f"run id job-1 was used before: {tmp_path / 'shared/output'} exists on node0, and a reused id would mix "
        "two runs' files. Leave train_run_id empty for a fresh one.",
    ]


def test_a_peer_that_does_not_share_the_master_s_storage_is_named(tmp_path):
    port = free_port()
    peer_dirs = tmp_path / "peer-local"
    peer_spec = node_spec(
        peer_dirs, "node1", port, rendezvous={"port": port, "timeout": 10, "master_addr": "127.0.0.1"}
    )
    for name in ("checkpoints", "output"):
        (peer_dirs / "shared" / name).mkdir(parents=True)
    peer = start(peer_spec)
    master = start(node_spec(tmp_path, "node0", port))
    assert report_of(master)["problems"] == []
    problems = report_of(peer)["problems"]
    assert len(problems) == 1
    assert problems[0].startswith(f"host node1 does not see {peer_dirs / 'shared/checkpoints'} as the master node0")


def test_a_directory_the_job_cannot_write_is_named_with_the_cause(tmp_path):
    # A file where the directory should be: unwritable for root too, which these tests run as.
    blocked = tmp_path / "shared" / "output"
    (tmp_path / "shared" / "checkpoints").mkdir(parents=True)
    blocked.write_text("not a directory")
    spec = node_spec(tmp_path, "node0", free_port(), nnodes=1)
    assert report_of(start(spec))["problems"][0] == f"host node0 cannot create {blocked} as user job (File exists)."
    again = spec | {"master_dirs": [], "run_node_dir": str(tmp_path / "nodes/node0/job-1-again")}
    assert report_of(start(again))["problems"] == [
        f"host node0 cannot write to {blocked} as user job (Not a directory): the job saves checkpoints and status "
        "there. Check the export is read-write, the mount is not read-only and job owns the directory "
        "(nfs_server_user, cluster_user)."
    ]


@pytest.mark.parametrize("reuse_port", [False, True])
def test_a_taken_rendezvous_port_is_refused_on_the_master(tmp_path, reuse_port):
    # Another program that allows reuse of its port still holds it: torchrun's store could not serve there alone.
    with socket.socket() as holder:
        if reuse_port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        master = start(node_spec(tmp_path, "node0", port))
        peer = start(
            node_spec(tmp_path, "node1", port)
            | {"rendezvous": {"port": port, "timeout": 3, "master_addr": "127.0.0.1"}}
        )
        master_problems = report_of(master)["problems"]
        # The peer reached the other program, which sends no greeting: the master alone names the cause.
        assert report_of(peer)["problems"] == []
    assert len(master_problems) == 1
    assert master_problems[0].startswith(f"rendezvous port {port} is not free on the master: ")


def test_a_master_whose_peers_do_not_come_says_how_many_came(tmp_path):
    port = free_port()
    spec = node_spec(tmp_path, "node0", port, nnodes=3) | {"rendezvous": {"port": port, "timeout": 0.5, "peers": 2}}
    assert report_of(start(spec))["problems"] == [f"only 0 of 2 peers reached port {port}"]
    assert not (tmp_path / "shared/checkpoints/.shared-check-job-1").exists()


def test_a_peer_that_cannot_reach_the_master_names_the_address_and_the_cause(tmp_path):
    with socket.socket() as closed:  # bound, never listening: every connection to it is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        spec = node_spec(tmp_path, "node1", port) | {
            "rendezvous": {"port": port, "timeout": 0.5, "master_addr": "127.0.0.1"}
        }
        problems = report_of(start(spec))["problems"]
    assert len(problems) == 1
    assert problems[0].startswith(f"cannot reach the master's rendezvous port 127.0.0.1:{port}: ")
    assert "refused" in problems[0]


def fake_venv(tmp_path: Path, version: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "lib/python3.11/site-packages" / f"torch-{version}.dist-info").mkdir(parents=True)
    return venv


def test_host_runtime_reads_torch_from_the_venv_and_names_missing_files(tmp_path):
    fake_venv(tmp_path, "2.13.0+cpu")
    torchrun = tmp_path / "venv/bin/torchrun"
    spec = {"node": "node0", "runtime": "host", "venv": str(tmp_path / "venv"), "required_files": [str(torchrun)]}
    report = ddp_prepare.prepare(spec)
    assert report["torch"] == "2.13.0+cpu"
    assert report["problems"] == [f"host node0 lacks {torchrun} (see train_venv, train_program, train_config)."]
    torchrun.parent.mkdir()
    torchrun.write_text("")
    assert ddp_prepare.prepare(spec)["problems"] == []
    assert ddp_prepare.prepare(spec | {"venv": str(tmp_path / "none")})["torch"] is None


def fake_docker(tmp_path: Path, monkeypatch, script: str) -> None:
    """A docker first on PATH that answers as the script says."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + script)
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_docker_runtime_reads_the_image_and_looks_inside_it_once_per_image_id(tmp_path, monkeypatch):
    # `image inspect` answers with the id (from image-id) and the label; `run ... test -f` finds only /app/train.py,
    # and each run is counted.
    (tmp_path / "image-id").write_text("sha256:abc\n")
    fake_docker(
        tmp_path,
        monkeypatch,
        f'case "$1" in image) echo "$(cat {tmp_path}/image-id) 2.13.0+cu128";;\n'
        f'  run) echo run >> {tmp_path}/runs; [ "$(eval echo \\${{$#}})" = /app/train.py ];; esac\n',
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    runs = lambda: (tmp_path / "runs").read_text().count("run")  # noqa: E731
    spec = {"node": "node0", "runtime": "docker", "image": "ddp-train:1", "program_in_image": "/app/train.py"}
    report = ddp_prepare.prepare(spec)
    assert (report["image_id"], report["torch"], report["problems"]) == ("sha256:abc", "2.13.0+cu128", [])
    assert ddp_prepare.prepare(spec)["problems"] == [] and runs() == 1  # known for this image id
    missing = ddp_prepare.prepare(spec | {"program_in_image": "/app/other.py"})["problems"]
    assert missing == ["the image ddp-train:1 on node0 has no /app/other.py (train_program)."]
    assert ddp_prepare.prepare(spec | {"program_in_image": "/app/other.py"})["problems"] == missing and runs() == 3
    (tmp_path / "image-id").write_text("sha256:def\n")  # another image under the same name: asked again
    assert ddp_prepare.prepare(spec)["problems"] == [] and runs() == 4


def test_docker_runtime_without_the_image_says_which_stage_builds_it(tmp_path, monkeypatch):
    fake_docker(tmp_path, monkeypatch, "echo 'Error: No such image' >&2; exit 1\n")
    report = ddp_prepare.prepare({"node": "node0", "runtime": "docker", "image": "ddp-train:1"})
    assert (report["image_id"], report["torch"]) == (None, None)
    assert report["problems"] == [
        "host node0 lacks the training image ddp-train:1 (train_image_name): run the container stage "
        "(ansible/playbooks/container.yml) first."
    ]


def test_the_master_runs_the_program_s_config_check_and_quotes_its_refusal(tmp_path):
    """The real program's --print-config (torch-free), as the preflight passes it on the master."""
    check = [sys.executable, str(ROOT / "train/train.py"), "--config", str(ROOT / "train/configs/cpu-smoke.yaml")]
    spec = {"node": "node0", "runtime": "host", "required_files": [], "config_check": [*check, "--print-config"]}
    assert ddp_prepare.prepare(spec)["problems"] == []
    bad = spec | {"config_check": [*check, "--set", "optim.lrr=1", "--print-config"]}
    assert ddp_prepare.prepare(bad)["problems"] == [
        "the training program refuses its config on node0 (train_program_args): config error: unknown key "
        "'optim.lrr' (did you mean 'lr'?)"
    ]
    # A program that is missing is named as missing; its config is not asked for.
    missing = bad | {"required_files": [str(tmp_path / "train.py")]}
    assert ddp_prepare.prepare(missing)["problems"] == [
        f"host node0 lacks {tmp_path / 'train.py'} (see train_venv, train_program, train_config)."
    ]


def test_the_config_check_imports_no_torch():
    """Half a minute on a slow node: the launch asks the program about its config without loading the trainer."""
    argv = [sys.executable, "-X", "importtime", "train/train.py", "--print-config"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert {"yaml", "ddp_train.cli", "ddp_train.config"} <= imported
    assert "torch" not in imported
    assert "run:\n  seed: 0\n" in done.stdout


def test_loose_dirs_names_each_directory_another_account_could_change(tmp_path):
    uid, gid = os.getuid(), os.getgid()
    assert ddp_prepare.loose_dirs(str(tmp_path / "private" / "node"), uid, gid) == []
    anyone = tmp_path / "anyone"
    anyone.mkdir()
    anyone.chmod(0o777)
    assert ddp_prepare.loose_dirs(str(anyone / "node"), uid, gid) == [f"{anyone} (uid {uid}, mode 777)"]
    # The sticky bit on a root-owned directory (/tmp) protects what others made in it; on the user's own it does
    # not count: only root's sticky directories are trusted.
    anyone.chmod(0o1777)
    expected = [] if uid == 0 else [f"{anyone} (uid {uid}, mode 1777)"]
    assert ddp_prepare.loose_dirs(str(anyone / "node"), uid, gid) == expected


def test_loose_dirs_follows_links_to_where_they_lead(tmp_path):
    uid, gid = os.getuid(), os.getgid()
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o757)
    (loose / "node").mkdir()
    link = tmp_path / "link"
    link.symlink_to(loose / "node")
    assert ddp_prepare.loose_dirs(str(link), uid, gid) == [f"{loose} (uid {uid}, mode 757)"]


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another account's needs root")
def test_loose_dirs_refuses_a_directory_another_account_owns(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    assert ddp_prepare.loose_dirs(str(theirs / "node"), 1000, 1000) == [f"{theirs} (uid 65534, mode 755)"]
    # root's own and the job user's own directories are trusted, whoever the job user is.
    assert ddp_prepare.loose_dirs(str(theirs / "node"), 65534, 65534) == []


def test_a_loose_node_dir_or_a_shared_dir_in_a_system_tree_makes_nothing(tmp_path):
    """Both are judged before anything is made: no run directory, no job directory on shared storage."""
    port = free_port()
    anyone = tmp_path / "anyone"
    anyone.mkdir()
    anyone.chmod(0o777)
    link = tmp_path / "data"
    link.symlink_to("/proc/self")
    spec = node_spec(tmp_path, "node0", port, nnodes=1) | {
        "node_dir": str(anyone / "node"),
        "run_node_dir": str(anyone / "node" / "job-1"),
        "shared_paths": {"train_shared_dir": str(link)},
        "system_paths": {"dirs": ["/"], "trees": ["/proc"]},
    }
    problems = report_of(start(spec))["problems"]
    assert problems[0].startswith(f"train_shared_dir={link} on node0 resolves to /proc/")
    assert problems[1].startswith(f"train_node_dir {anyone}/node on node0 is not private to job: {anyone} (uid")
    assert list(anyone.iterdir()) == []
    assert not (tmp_path / "shared").exists()


def test_the_job_s_directories_on_shared_storage_are_private_to_its_user(tmp_path):
    port = free_port()
    report = report_of(start(node_spec(tmp_path, "node0", port, nnodes=1)))
    assert report["problems"] == []
    made = [tmp_path / "shared", *(tmp_path / "shared").iterdir(), tmp_path / "nodes" / "node0"]
    assert {path.name: oct(path.stat().st_mode & 0o777) for path in made} == {
        "shared": "0o711",
        "checkpoints": "0o711",
        "output": "0o711",
        "work": "0o711",
        "node0": "0o700",
    }


def test_a_preflight_that_hangs_past_its_deadline_answers_naming_what_it_touches(tmp_path):
    spec = node_spec(tmp_path, "node0", free_port(), nnodes=1) | {"config_check": ["sleep", "60"], "deadline_s": 1}
    began = time.monotonic()
    problems = report_of(start(spec))["problems"]
    assert time.monotonic() - began < 20
    shared = tmp_path / "shared"
    assert problems == [
        f"the preflight on node0 did not finish within 1 s; it reads and writes {shared}/checkpoints, "
        f"{shared}/output, {shared}/work as user job: is that mount hung there (NFS server down, or the firewall)? "
        "Check with findmnt and ls on the node."
    ]


def test_a_private_node_dir_and_a_shared_dir_of_its_own_pass_and_a_link_to_a_system_dir_does_not(tmp_path):
    port = free_port()
    (tmp_path / "data").mkdir()
    spec = node_spec(tmp_path, "node0", port, nnodes=1) | {
        "node_dir": str(tmp_path / "nodes" / "node0"),
        "shared_paths": {"train_shared_dir": str(tmp_path / "data")},
        "system_paths": {"dirs": ["/", "/var"], "trees": ["/proc"]},
    }
    # A deadline far off changes nothing, and the report says what runs here.
    report = report_of(start(spec | {"deadline_s": 60}))
    assert report["problems"] == []
    assert (report["uid"], report["gid"]) == (os.getuid(), os.getgid())
    assert report["python"] == platform.python_version() and report["machine"] == platform.machine()
    assert report["torch"] is None and report["image_id"] is None  # no venv there, no image
    (tmp_path / "root-link").symlink_to("/")
    again = spec | {
        "run_id": "job-2",
        "run_node_dir": str(tmp_path / "nodes" / "node0" / "job-2"),
        "shared_paths": {"train_shared_dir": str(tmp_path / "root-link")},
    }
    assert report_of(start(again))["problems"] == [
        f"train_shared_dir={tmp_path}/root-link on node0 resolves to /, a system directory: the job would write its "
        "files there. Use a directory of its own, e.g. /data or /srv/ddp."
    ]
