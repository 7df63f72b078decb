"""site.yml refuses bad input in its read-only preflight (ansible/playbooks/preflight.yml), before any host
is changed: each case is refused naming the variable and the host, with changed=0 on every host and no task of
a later stage started.

Safety: site.yml runs here only with inventories the preflight must refuse, and in check mode besides, so that
a preflight that wrongly let a case through still could not provision this machine. The good baseline runs
through preflight.yml alone, which only reads. Every host is this machine (connection local), except the
unreachable one: SSH to a closed port on loopback.
"""

from pathlib import Path

import pytest
import yaml
from _playbooks import LOCAL_HOST, write_inventory

pytestmark = pytest.mark.slow  # one ansible-playbook run per case

ROOT = Path(__file__).resolve().parents[2]
LAB_VARS = ROOT / "inventory/lab/group_vars/all"
BASE_HOSTS = {"node0": {"cluster_address": "127.0.0.1"}, "node1": {"cluster_address": "127.0.0.2"}}
BASE_GROUPS = {
    "cluster": ["node0", "node1"],
    "nfs_server": ["node0"],
    "nfs_clients": ["node1"],
    "training": ["node0", "node1"],
}
# The lab's settings, on loopback: the interfaces every machine has, the CIDR its addresses are in.
LOOPBACK = {
    "cluster_cidrs": ["127.0.0.0/8"],
    "admin_cidrs": ["127.0.0.0/8"],
    "train_env": {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"},
}
# The plays of the stages after the preflight (as site.yml imports them): none may start. The preflight runs the
# roles' own input checks (TASK [firewall : ...]), so a role's name in a task title is no sign of a stage.
STAGES = ("trust", "ssh", "firewall", "storage", "gpu", "container")
LATER_STAGES = tuple(
    f"PLAY [{play['name']}]"
    for stage in STAGES
    for play in yaml.safe_load((ROOT / "ansible/playbooks" / f"{stage}.yml").read_text())
)


def baseline_vars() -> dict:
    """inventory/lab/group_vars/all, file by file as Ansible reads them, with LOOPBACK on top."""
    settings: dict = {}
    for path in sorted(LAB_VARS.glob("*.yml")):
        settings.update(yaml.safe_load(path.read_text()) or {})
    return {**settings, **LOOPBACK}


def case_inventory(tmp_path: Path, hosts: dict | None = None, groups: dict | None = None, **group_vars) -> Path:
    """The baseline inventory (node0 serves NFS, node1 mounts it, both train) with a case's overrides: host
    variables (a new host name adds a local host), group memberships (None drops the group), group_vars.
    Fake trees with one NVIDIA GPU lie at <inventory>/dev and <inventory>/pci (its HDMI audio function beside it),
    for train_dev_path and train_pci_devices_path."""
    inventory = tmp_path / "inventory"
    (inventory / "dev").mkdir(parents=True)
    (inventory / "dev" / "nvidia0").touch()
    for function, device_class in (("0000:17:00.0", "0x030200"), ("0000:17:00.1", "0x040300")):
        (inventory / "pci" / function).mkdir(parents=True)
        (inventory / "pci" / function / "vendor").write_text("0x10de\n")
        (inventory / "pci" / function / "class").write_text(device_class + "\n")
    all_hosts = {name: {**LOCAL_HOST, **BASE_HOSTS.get(name, {})} for name in {**BASE_HOSTS, **(hosts or {})}}
    for name, overrides in (hosts or {}).items():
        all_hosts[name].update(overrides)
    members = {name: group for name, group in {**BASE_GROUPS, **(groups or {})}.items() if group is not None}
    return write_inventory(inventory, all_hosts, members, {**baseline_vars(), **group_vars})


# Each case: overrides of the baseline, and the texts the refusal must hold (the variable, then the host).
NODE2 = {"node2": {"cluster_address": "127.0.0.3"}}
WITH_NODE2 = {
    "cluster": ["node0", "node1", "node2"],
    "nfs_clients": ["node1", "node2"],
    "training": ["node0", "node1", "node2"],
}
CASES = {
    "two NFS servers": (
        {"groups": {"nfs_server": ["node0", "node1"], "nfs_clients": []}},
        ["group nfs_server holds 2 host(s) (node0, node1)"],
    ),
    "no NFS server": (
        {"groups": {"nfs_server": None}},
        ["group nfs_server holds 0 host(s)", "the cluster (node0, node1)"],
    ),
    "the NFS server also a client": (
        {"groups": {"nfs_clients": ["node0", "node1"]}},
        ["node0 is in both group nfs_server and group nfs_clients"],
    ),
    "master outside the cluster": (
        {"hosts": {"nodeX": {"cluster_address": "127.0.0.9"}}, "groups": {"training": ["nodeX", "node0", "node1"]}},
        ["training host(s) nodeX of group 'training' are not in group 'cluster'"],
    ),
    "a host listed twice": (
        {"hosts": {"node2": {"cluster_address": "127.0.0.2"}}, "groups": WITH_NODE2},
        ["cluster_address=127.0.0.2 on node1 and node2"],
    ),
    "nproc_per_node above the inventory's gpu_count": (
        {"hosts": {"node1": {"gpu_count": 4, "train_nproc_per_node": 8}}},
        ["train_nproc_per_node=8 on node1 is more than its 4 GPU(s) (gpu_count)"],
    ),
    "nproc_per_node above the node's GPUs": (
        {"hosts": {"node1": {"train_nproc_per_node": 2, "train_dev_path": "{{ inventory_dir }}/dev"}}},
        ["train_nproc_per_node=2 on node1 is more than its 1 GPU(s) (device nodes)"],
    ),
    "a node short of its inventory's gpu_count": (
        {"hosts": {"node1": {"gpu_count": 2, "train_pci_devices_path": "{{ inventory_dir }}/pci"}}},
        ["gpu_count=2 in the inventory for node1, but it has 1 NVIDIA GPU(s) on PCI"],
    ),
    "rendezvous port out of range": (
        {"hosts": {"node1": {"rendezvous_port": 70000}}},
        ["rendezvous_port=70000 on node1: not a port"],
    ),
    "firewall port out of range": (
        {"hosts": {"node0": {"firewall_ssh_port": 0}}},
        ["firewall_ssh_port=0 on node0: not a port"],
    ),
    "rendezvous port is the SSH port": (
        {"hosts": {"node1": {"rendezvous_port": 22}}},
        ["rendezvous_port=22 on node1 is also firewall_ssh_port=22"],
    ),
    "rendezvous port is the NFS port": (
        {"group_vars": {"rendezvous_port": 2049}},
        ["rendezvous_port=2049 on node0 is also firewall_nfs_port=2049"],
    ),
    "rendezvous port inside the data port range": (
        {"hosts": {"node1": {"rendezvous_port": 50500}}},
        ["rendezvous_port=50500 on node1 is also inside firewall_data_port_range_start-end (50000-51999)"],
    ),
    "malformed cluster CIDR": (
        {"hosts": {"node1": {"cluster_cidrs": ["127.0.0.0/8", "10.0.0.300/24"]}}},
        ["cluster_cidrs entry 10.0.0.300/24 on node1"],
    ),
    "admin CIDR with host bits": (
        {"group_vars": {"admin_cidrs": ["127.0.0.1/8"]}},
        ["admin_cidrs entry 127.0.0.1/8 on node0"],
    ),
    "version not exact": (
        {"hosts": {"node1": {"gpu_stack_cuda_version": "12.4"}}},
        ["host node1: gpu_stack_cuda_version='12.4'"],
    ),
    "NCCL_SOCKET_IFNAME names an interface the node lacks": (
        {"hosts": {"node1": {"train_env": {"NCCL_SOCKET_IFNAME": "ib9"}}}},
        ["NCCL_SOCKET_IFNAME=ib9 in train_env on node1: no such interface"],
    ),
    "GLOO_SOCKET_IFNAME names an interface the node lacks": (
        {"hosts": {"node0": {"train_env": {"GLOO_SOCKET_IFNAME": "eth9"}}}},
        ["GLOO_SOCKET_IFNAME=eth9 in train_env on node0: no such interface"],
    ),
    "an unreachable node": (
        {
            "hosts": {
                "node2": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1, **NODE2["node2"]}
            },
            "groups": WITH_NODE2,
        },
        ["node2 is unreachable (ansible_host=127.0.0.1", "ansible_port=1"],
    ),
    "two nodes with a checkpoint directory that is not shared": (
        {"group_vars": {"train_checkpoint_dir": "/var/tmp/ddp-checkpoints"}},
        ["train_checkpoint_dir=/var/tmp/ddp-checkpoints on node0", "shared_dir=/data"],
    ),
    "a training node that does not mount the shared directory": (
        {"hosts": NODE2, "groups": {**WITH_NODE2, "nfs_clients": ["node1"]}},
        ["shared_dir=/data is not shared with node2", "in nfs_clients"],
    ),
    "unknown runtime": (
        {"hosts": {"node0": {"train_runtime": "kubernetes"}}},
        ["train_runtime=kubernetes on node0: must be host or docker"],
    ),
    # An inventory written before the rename: nothing would read the old name, so the default image would be built
    # and run in silence.
    "the training image under its old name": (
        {"hosts": {"node1": {"train_image": "ddp-train:gpu"}}},
        ["train_image on node1 is the old name of train_image_name, which nothing reads any more"],
    ),
    # The NFS server would chown these to the cluster user and export them read-write (set on the server
    # alone, so that the clients' own check of the same value does not speak first).
    "the shared directory is /": (
        {"hosts": {"node0": {"shared_dir": "/"}}},
        ["nfs_server_shared_dir=/ on node0: a system directory"],
    ),
    "the shared directory is /etc": (
        {"hosts": {"node0": {"shared_dir": "/etc"}}},
        ["nfs_server_shared_dir=/etc on node0: a system directory"],
    ),
    "the shared directory is inside /usr": (
        {"hosts": {"node0": {"shared_dir": "/usr/local/ddp"}}},
        ["nfs_server_shared_dir=/usr/local/ddp on node0: a system directory"],
    ),
    "the shared directory is relative": (
        {"hosts": {"node0": {"shared_dir": "data"}}},
        ["nfs_server_shared_dir=data on node0: not an absolute path"],
    ),
    # A client would mount over it, hiding the system's own files.
    # Only on the client, so that the server's own refusal of /var (the case above) cannot come first.
    "the shared directory is a system directory on a client": (
        {"hosts": {"node1": {"shared_dir": "/var"}}},
        ["nfs_client_mount_point=/var on node1: a system directory"],
    ),
    # On the NFS server: on a client, the server's check of its members (an earlier play) would speak first.
    "the cluster CIDRs exclude a node's own address": (
        {"hosts": {"node0": {"cluster_address": "10.0.0.2"}}},
        ["ssh_mesh_address=10.0.0.2 on node0 is not in ssh_mesh_allowed_cidrs (127.0.0.0/8)"],
    ),
    "a cluster_address that is not an IP address": (
        {"hosts": {"node0": {"cluster_address": "node-zero.example"}}},
        ["cluster_address=node-zero.example on node0: not an IP address"],
    ),
    # The server exports to each member's own address; one outside the cluster CIDRs is refused naming it.
    "an NFS client whose address is outside the cluster CIDRs": (
        {"hosts": {"node1": {"cluster_address": "10.0.0.2"}}},
        ["cluster_address=10.0.0.2 on node1 is not in nfs_server_allowed_cidrs (127.0.0.0/8)"],
    ),
    "an NFS client whose address is a name": (
        {"hosts": {"node1": {"cluster_address": "node-one.example"}}},
        ["cluster_address=node-one.example on node1: not an IP address"],
    ),
    "the data port range holds the SSH port": (
        {"group_vars": {"firewall_data_port_range_start": 1, "firewall_data_port_range_end": 1023}},
        ["firewall_ssh_port=22 on node0 is also inside firewall_data_port_range_start-end (1-1023)"],
    ),
    "the data port range starts above its end": (
        {"hosts": {"node1": {"firewall_data_port_range_start": 52000}}},
        ["firewall_data_port_range_start=52000 on node1 is above firewall_data_port_range_end=51999"],
    ),
    "admin access from every IPv6 address": (
        {"group_vars": {"admin_cidrs": ["127.0.0.0/8", "::/0"]}},
        ["firewall_admin_cidrs entry ::/0 on node0: /0 is every IPv6 address"],
    ),
    "admin access from every IPv4 address": (
        {"hosts": {"node1": {"admin_cidrs": ["0.0.0.0/0"]}}},
        ["firewall_admin_cidrs entry 0.0.0.0/0 on node1: /0 is every IPv4 address"],
    ),
    "a wildcard Docker version": (
        {"group_vars": {"docker_version": "27.*"}},
        ["docker_version='27.*' on node0: not an exact version"],
    ),
    "a version range for the NVIDIA container toolkit": (
        {"hosts": {"node1": {"docker_nvidia_toolkit_version": ">=1.17"}}},
        ["docker_nvidia_toolkit_version='>=1.17' on node1: not an exact version"],
    ),
    "exports without root squashing": (
        {"group_vars": {"nfs_server_export_options": ["rw", "sync", "no_root_squash", "no_subtree_check"]}},
        ["nfs_server_export_options entry 'no_root_squash' on node0: weakens root squashing"],
    ),
    "exports to unprivileged client ports": (
        {"group_vars": {"nfs_server_export_options": ["rw", "sync", "insecure", "all_squash"]}},
        ["nfs_server_export_options entry 'insecure' on node0", "nfs_server_export_options entry 'all_squash'"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_refused_before_any_host_changes(tmp_path, playbook, case):
    overrides, names = CASES[case]
    inventory = case_inventory(
        tmp_path, overrides.get("hosts"), overrides.get("groups"), **overrides.get("group_vars", {})
    )
    run = playbook("site.yml", inventory, "--check")
    output = run.output
    assert run.rc != 0, output[-3000:]
    for name in names:
        assert name in output, output[-3000:]
    changed = run.changed_per_host()
    assert changed and not any(changed.values()), changed
    started = [stage for stage in LATER_STAGES if stage in output]
    assert not started, output[-3000:]


def test_baseline_passes_the_preflight(tmp_path, playbook):
    run = playbook("ansible/playbooks/preflight.yml", case_inventory(tmp_path))
    assert run.rc == 0, run.output[-3000:]
    assert run.changed_per_host() == {"localhost": 0, "node0": 0, "node1": 0}, run.output[-1500:]


def test_weak_export_options_pass_when_the_inventory_says_so(tmp_path, playbook):
    options = {"nfs_server_export_options": ["rw", "sync", "no_root_squash"], "nfs_server_allow_weak_options": True}
    run = playbook("ansible/playbooks/preflight.yml", case_inventory(tmp_path, **options))
    assert run.rc == 0, run.output[-3000:]


def test_a_shared_dir_that_links_into_a_system_tree_is_refused_on_the_node_by_both_nfs_roles(tmp_path, playbook):
    """/data as written passes the preflight; where it leads is judged on the node, before the server hands it to
    the cluster user or a client mounts over it. /proc is the tree: nothing could be changed there anyway, and
    the storage stage runs in check mode besides."""
    data = tmp_path / "data"
    data.symlink_to("/proc/self")
    server = playbook("ansible/playbooks/storage.yml", case_inventory(tmp_path, shared_dir=str(data)), "--check")
    assert server.rc != 0, server.output[-3000:]
    assert f"nfs_server: export {data} on node0 resolves to /proc/" in server.output, server.output[-3000:]
    assert not any(server.changed_per_host().values()), server.output[-1500:]  # check mode: what it would change
    # The server alone (no client play runs after its failure): the client, against a server whose path is fine.
    client_only = case_inventory(tmp_path / "client", hosts={"node1": {"nfs_client_mount_point": str(data)}})
    client = playbook("ansible/playbooks/storage.yml", client_only, "--check", "--limit", "node1")
    assert client.rc != 0, client.output[-3000:]
    assert f"nfs_client: mount point {data} on node1 resolves to /proc/" in client.output, client.output[-3000:]
    assert not any(client.changed_per_host().values()), client.output[-1500:]
