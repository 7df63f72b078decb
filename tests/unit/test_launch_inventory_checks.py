"""Bad inventories are refused by the launch playbook before any node is touched, naming the variable."""

from pathlib import Path

import ansible_runner
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_inventory(tmp_path: Path, groups: dict, group_vars: dict) -> Path:
    inventory = tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    hosts = {"all": {"hosts": {"localhost": local}, "children": groups}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
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
    (inventory / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(settings))
    return inventory


GOOD_GROUPS = {"cluster": {"hosts": {"localhost": None}}, "training": {"hosts": {"localhost": None}}}

CASES = {
    "no training group (no master)": (
        {"cluster": {"hosts": {"localhost": None}}},
        {},
        "group 'training' is missing or empty",
    ),
    "training host outside the cluster group": (
        {"cluster": {"hosts": {}}, "training": {"hosts": {"localhost": None}}},
        {},
        "are not in group 'cluster'",
    ),
    "nproc_per_node 0": (
        GOOD_GROUPS,
        {"train_nproc_per_node": 0},
        "train_nproc_per_node=0 on host localhost",
    ),
    "rendezvous port out of range": (GOOD_GROUPS, {"rendezvous_port": 70000}, "rendezvous_port=70000"),
    "unknown runtime": (GOOD_GROUPS, {"train_runtime": "kubernetes"}, "train_runtime"),
    "rendezvous port is the SSH port": (GOOD_GROUPS, {"rendezvous_port": 22}, "rendezvous_port=22 clashes with ssh"),
    "rendezvous port inside the pinned ephemeral range": (
        GOOD_GROUPS,
        {
            "rendezvous_port": 50500,
            "firewall_data_ports_mode": "ephemeral_range",
            "firewall_data_port_range_start": 50000,
            "firewall_data_port_range_end": 51999,
        },
        "clashes with the ephemeral port range 50000-51999",
    ),
    "NCCL_SOCKET_IFNAME names an interface the node lacks": (
        GOOD_GROUPS,
        {"train_env": {"NCCL_SOCKET_IFNAME": "ib9"}},
        "NCCL_SOCKET_IFNAME=ib9 in train_env on localhost: no such interface",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inventory_refused_before_launch(tmp_path, case):
    groups, group_vars, message = CASES[case]
    inventory = write_inventory(tmp_path, groups, group_vars)
    private_dir = tmp_path / "runner"
    private_dir.mkdir()
    run = ansible_runner.run(
        private_data_dir=str(private_dir),
        playbook=str(ROOT / "ansible/playbooks/train.yml"),
        inventory=str(inventory),
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        },
        quiet=True,
    )
    output = run.stdout.read()
    assert run.rc != 0, output[-2000:]
    assert message in output, output[-2000:]
    # Refused before any change: nothing was created on the node or on shared storage.
    assert not (tmp_path / "node").exists()
    assert not (tmp_path / "shared").exists()
    assert "Start torchrun" not in output
