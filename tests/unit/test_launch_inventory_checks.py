"""Bad inventories are refused by the launch playbook before any node is touched, naming the variable."""

from pathlib import Path

import pytest
from _playbooks import LOCAL_HOST, write_inventory

ROOT = Path(__file__).resolve().parents[2]


def local_inventory(tmp_path: Path, groups: dict[str, list[str]], group_vars: dict) -> Path:
    """localhost in the given groups, with the settings a launch on this machine needs under tmp_path."""
    settings = {
        "cluster_user": "root",
        "cluster_cidrs": ["127.0.0.0/8"],
        "shared_dir": str(tmp_path / "shared"),
        "rendezvous_port": 29500,
        "train_venv": str(ROOT / ".venv"),
        "train_code_dir": str(ROOT / "train"),
        "train_node_dir": str(tmp_path / "node"),
        "train_artifacts_dir": str(tmp_path / "artifacts"),
        **group_vars,
    }
    return write_inventory(tmp_path / "inventory", {"localhost": LOCAL_HOST}, groups, settings)


GOOD_GROUPS = {"cluster": ["localhost"], "training": ["localhost"]}

CASES = {
    "no training group (no master)": (
        {"cluster": ["localhost"]},
        {},
        "group 'training' is missing or empty",
    ),
    "training host outside the cluster group": (
        {"cluster": [], "training": ["localhost"]},
        {},
        "are not in group 'cluster'",
    ),
    "nproc_per_node 0": (
        GOOD_GROUPS,
        {"train_nproc_per_node": 0},
        "train_nproc_per_node=0 on localhost: must be 'auto' or a positive integer",
    ),
    "a job name that is no plain name": (GOOD_GROUPS, {"train_job_name": "../x"}, "train_job_name=../x: not a plain"),
    "a run id with a trailing newline": (GOOD_GROUPS, {"train_run_id": "r1\n"}, "train_run_id=r1\n: not a plain"),
    "a data name that is no plain name": (
        GOOD_GROUPS,
        {"train_data_dir": "/tmp", "train_data_name": "../up"},
        "train_data_name=../up: not a plain",
    ),
    "rendezvous port out of range": (GOOD_GROUPS, {"rendezvous_port": 70000}, "rendezvous_port=70000: not a port"),
    "unknown runtime": (GOOD_GROUPS, {"train_runtime": "kubernetes"}, "train_runtime"),
    "rendezvous port is the SSH port": (
        GOOD_GROUPS,
        {"rendezvous_port": 22},
        "rendezvous_port=22 is also firewall_ssh_port=22: it needs a port of its own",
    ),
    "rendezvous port inside the pinned ephemeral range": (
        GOOD_GROUPS,
        {
            "rendezvous_port": 50500,
            "firewall_data_ports_mode": "ephemeral_range",
            "firewall_data_port_range_start": 50000,
            "firewall_data_port_range_end": 51999,
        },
        "rendezvous_port=50500 is also inside firewall_data_port_range_start-end (50000-51999)",
    ),
    "a cluster address that is no address": (
        GOOD_GROUPS,
        {"cluster_address": "127.0.0.1 $(id)"},
        "cluster_address=127.0.0.1 $(id) on localhost: not an IP address",
    ),
    "NCCL_SOCKET_IFNAME names an interface the node lacks": (
        GOOD_GROUPS,
        {"train_env": {"NCCL_SOCKET_IFNAME": "ib9"}},
        "NCCL_SOCKET_IFNAME=ib9 in train_env on localhost: no such interface",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inventory_refused_before_launch(tmp_path, playbook, case):
    groups, group_vars, message = CASES[case]
    run = playbook("ansible/playbooks/train.yml", local_inventory(tmp_path, groups, group_vars))
    output = run.output
    assert run.rc != 0, output[-2000:]
    assert message in output, output[-2000:]
    # Refused before any change: nothing was created on the node or on shared storage.
    assert not (tmp_path / "node").exists()
    assert not (tmp_path / "shared").exists()
    assert not run.started_any_of("train/tasks/run.yml"), sorted(run.started_task_files())


def test_a_node_dir_another_account_could_change_is_refused_on_the_node(tmp_path, playbook):
    """A world-writable parent without the sticky bit lets anyone swap the run's directory: refused on the node,
    and nothing is made under it."""
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    inventory = local_inventory(tmp_path, GOOD_GROUPS, {"train_node_dir": str(loose / "node")})
    run = playbook("ansible/playbooks/train.yml", inventory)
    assert run.rc != 0, run.output[-2000:]
    assert f"train_node_dir {loose}/node on localhost is not private to root: {loose} (uid 0, mode 777)" in run.output
    assert list(loose.iterdir()) == []
    assert not (tmp_path / "shared").exists()
    assert not run.started_any_of("train/tasks/run.yml")


def test_a_shared_dir_that_links_into_a_system_tree_is_refused_on_the_node(tmp_path, playbook):
    """/data written in the inventory but a link into a system tree is judged by where it leads. /proc is the tree:
    nothing could be made there even if the check let it through."""
    data = tmp_path / "data"
    data.symlink_to("/proc/self")
    inventory = local_inventory(tmp_path, GOOD_GROUPS, {"shared_dir": str(data)})
    run = playbook("ansible/playbooks/train.yml", inventory)
    assert run.rc != 0, run.output[-2000:]
    assert f"train_shared_dir={data} on localhost resolves to /proc/" in run.output
    assert "a system directory" in run.output
    assert not (tmp_path / "node").exists()
    assert not run.started_any_of("train/tasks/run.yml")
