"""The project's input validators (ansible/plugins/filter/ddp_validators.py), table by table: what each accepts,
what it refuses and that the refusal names the variable, the value and the host. Pure functions, loaded by path
like Ansible loads the plugin; no Ansible run, so the whole file takes well under a second."""

from pathlib import Path

import pytest
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "ansible/plugins/filter/ddp_validators.py"
v = load("ddp_validators", PLUGIN)


def test_every_validator_is_offered_as_a_filter():
    filters = v.FilterModule().filters()
    assert all(name.startswith("ddp_") and callable(f) for name, f in filters.items())
    assert filters["ddp_cidr_problems"] is v.cidr_problems


# --- CIDRs ------------------------------------------------------------------------------------------------------
CIDRS_OK = [
    ("10.0.0.0/8", {}),
    ("192.168.1.0/24", {}),
    (" 172.16.0.0/12\n", {}),  # YAML block scalars leave whitespace behind
    ("10.0.0.0/255.0.0.0", {}),
    ("10.1.2.3", {}),  # a single address, as /32
    ("2001:db8::/32", {}),
    ("fd00::1", {}),
    ("0.0.0.0/0", {"everyone": True}),
    ("10.213.50.0/24", {"family": 4, "addresses": False}),
]
CIDRS_BAD = [
    # (entry, options, what the message says)
    ("10.0.0.1/24", {}, "host bits set (the network would be 10.0.0.0/24)"),
    ("fd00::1/8", {}, "host bits set"),
    ("999.1.1.1/99", {}, "not an IP network"),  # ssh_mesh's old regex let this through
    ("10.0.0.300/24", {}, "not an IP network"),
    ("10.0.0.0/33", {}, "not an IP network"),
    ("2001:db8::/129", {}, "not an IP network"),
    ("node1.example/24", {}, "not an IP network"),
    ("", {}, "not an IP network"),
    (None, {}, "not an IP network"),
    ("fe80::1%eth0", {}, "scope"),
    ("fe80::%eth0/64", {}, "scope"),
    ("0.0.0.0/0", {}, "/0 is every IPv4 address"),
    ("::/0", {}, "/0 is every IPv6 address"),  # as much "everyone" as 0.0.0.0/0
    ("::/0", {"family": 4, "everyone": True}, "an IPv6 network, where only IPv4 is taken"),
    ("10.213.50.0", {"addresses": False}, "a single address"),
]


@pytest.mark.parametrize(("value", "options"), CIDRS_OK)
def test_cidrs_accepted(value, options):
    assert v.cidr_problems([value], "cluster_cidrs", "node0", **options) == []


@pytest.mark.parametrize(("value", "options", "reason"), CIDRS_BAD)
def test_cidrs_refused_naming_entry_variable_and_host(value, options, reason):
    (problem,) = v.cidr_problems([value], "admin_cidrs", "node1", **options)
    assert problem.startswith(f"admin_cidrs entry {value} on node1: ")
    assert reason in problem


def test_cidrs_one_problem_per_bad_entry_and_not_a_list_refused():
    assert len(v.cidr_problems(["10.0.0.0/8", "10.0.0.1/8", "::/0", "x"], "c")) == 3
    assert v.cidr_problems("10.0.0.0/8", "cluster_cidrs", "n") == [
        "cluster_cidrs=10.0.0.0/8 on n: not a list of networks"
    ]


# --- addresses ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "ok"), [("10.0.0.1", True), ("::1", True), ("node0", False), ("10.0.0.0/8", False)])
def test_address(value, ok):
    assert (v.address_problems(value, "cluster_address", "node0") == []) is ok


ADDRESS_IN = [
    ("127.0.0.2", ["127.0.0.0/8"], True),
    ("10.0.0.5", ["192.168.0.0/16", "10.0.0.0/24"], True),
    ("2001:db8::5", ["2001:db8::/32"], True),
    ("127.0.0.2", ["10.0.0.0/8"], False),
    ("10.0.1.5", ["10.0.0.0/24", "garbage"], False),  # a bad entry is the CIDR check's to name
    ("node0", ["10.0.0.0/8"], False),
]


@pytest.mark.parametrize(("address", "cidrs", "inside"), ADDRESS_IN)
def test_address_in_cidrs(address, cidrs, inside):
    problems = v.address_in_cidrs_problems(address, cidrs, "ssh_mesh_address", "ssh_mesh_allowed_cidrs", "node0")
    assert (problems == []) is inside
    if not inside:
        assert problems[0].startswith(f"ssh_mesh_address={address} on node0")


# --- ports --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "ok"), [(1, True), (65535, True), ("22", True), (0, False), (65536, False), ("x", False), (-1, False)]
)
def test_port(value, ok):
    assert (v.port_problems({"rendezvous_port": value}, "node1") == []) is ok


def test_port_message_and_lists():
    (problem,) = v.port_problems({"rendezvous_port": 70000}, "node1")
    assert problem == "rendezvous_port=70000 on node1: not a port (1-65535)"
    assert v.port_problems({"firewall_nfs_v3_ports": [111, 0]}) == ["firewall_nfs_v3_ports=0: not a port (1-65535)"]


SERVICES = {"firewall_ssh_port": 22, "firewall_nfs_port": 2049, "firewall_nfs_v3_ports": [111, 32765]}
RANGES = [
    # (start, end, services, what the problems say; empty: accepted)
    (50000, 51999, SERVICES, []),
    (50000, 50000, SERVICES, []),
    (52000, 51999, SERVICES, ["firewall_data_port_range_start=52000 on n is above firewall_data_port_range_end=51999"]),
    (1, 1024, SERVICES, ["firewall_ssh_port=22 on n is also inside", "firewall_nfs_v3_ports=111 on n is also inside"]),
    (2049, 2049, SERVICES, ["firewall_nfs_port=2049 on n is also inside firewall_data_port_range_start-end (2049-"]),
    (0, 10, SERVICES, ["firewall_data_port_range_start=0 on n: not a port"]),
    (1, 1024, {}, []),
]


@pytest.mark.parametrize(("start", "end", "services", "expected"), RANGES)
def test_port_range(start, end, services, expected):
    problems = v.port_range_problems(start, end, services, "n")
    assert len(problems) == len(expected), problems
    for problem, text in zip(problems, expected, strict=True):
        assert problem.startswith(text)


def test_port_clash():
    assert v.port_clash_problems(29500, "rendezvous_port", SERVICES, "n") == []
    (problem,) = v.port_clash_problems(22, "rendezvous_port", SERVICES, "node1")
    assert problem.startswith("rendezvous_port=22 on node1 is also firewall_ssh_port=22")
    (problem,) = v.port_clash_problems("32765", "rendezvous_port", SERVICES, "n")
    assert "firewall_nfs_v3_ports=32765" in problem


# --- interfaces ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "ok"), [("eth0", True), ("enp1s0f0.100", True), ("", False), ("a" * 16, False), ("eth0 ", False)]
)
def test_interface_name(value, ok):
    assert (v.interface_problems(value, "GLOO_SOCKET_IFNAME", "n") == []) is ok


MISSING = [
    ({"NCCL_SOCKET_IFNAME": "eth"}, []),  # a prefix
    ({"NCCL_SOCKET_IFNAME": "=eth"}, ["NCCL_SOCKET_IFNAME=eth"]),  # an exact name
    ({"NCCL_SOCKET_IFNAME": "^ib"}, []),  # an exclusion
    ({"NCCL_SOCKET_IFNAME": "ib9,lo"}, ["NCCL_SOCKET_IFNAME=ib9"]),
    ({"GLOO_SOCKET_IFNAME": "eth"}, ["GLOO_SOCKET_IFNAME=eth"]),  # gloo takes exact names only
    ({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}, []),
]


@pytest.mark.parametrize(("env", "missing"), MISSING)
def test_missing_interfaces(env, missing):
    problems = v.missing_interfaces(env, ["lo", "eth0"], "node1")
    assert bool(problems) == bool(missing)
    if missing:
        assert problems[0].startswith(", ".join(missing) + " in train_env on node1: no such interface")


# --- versions -----------------------------------------------------------------------------------------------------
VERSIONS = [
    # (value, revision required, accepted)
    ("535.216.03-2~bpo12+1", True, True),
    ("12.4.127~12.4.1-2", True, True),
    ("2.22.3-1-1", True, True),
    ("1:550.54.15-0ubuntu1", True, True),
    ("2.21.5-1+cuda12.4", True, True),
    ("2.22.3", True, False),  # no Debian revision
    ("535", True, False),
    ("27.3.1", False, True),
    ("1.17.3-1", False, True),
    ("535.*", False, False),
    ("27.*", False, False),
    (">=2.0", False, False),
    ("~>27", False, False),
    ("27.3.1-*", False, False),
    ("1.2 || 1.3", False, False),
    ("27.0-27.3", False, True),  # a valid Debian version (a hyphen is its revision separator), not a range
    ("latest", False, False),
    ("", False, False),
    (None, False, False),
]


@pytest.mark.parametrize(("value", "revision", "ok"), VERSIONS)
def test_exact_version(value, revision, ok):
    problems = v.version_problems(value, "docker_version", "node0", revision=revision)
    assert (problems == []) is ok
    if not ok:
        assert problems[0].startswith(f"docker_version='{value or ''}' on node0: not an exact version")


def test_versions_of_several_variables_as_pairs_or_mapping():
    pairs = [["gpu_stack_cuda_version", "12.4"], ["gpu_stack_nccl_version", "2.21.5-1+cuda12.4"]]
    assert v.versions_problems(pairs, revision=True) == v.versions_problems(dict(pairs), revision=True)
    (problem,) = v.versions_problems(pairs, revision=True)
    assert problem.startswith("gpu_stack_cuda_version='12.4': ")


# --- names and paths ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("ddp-demo", True),
        ("run_2024.01", True),
        ("a", True),
        ("", False),
        (".", False),
        ("..", False),
        ("a..b", False),
        ("../x", False),
        ("a/b", False),
        ("-x", False),
        ("a b", False),
        (None, False),
    ],
)
def test_safe_name(value, ok):
    assert (v.safe_name_problems(value, "train_job_name", "n") == []) is ok


SHARED_DIRS = [
    ("/data", True),
    ("/srv/ddp", True),
    ("/mnt/scratch", True),
    ("/home/ddp/shared", True),
    ("/var/nfs/ddp", True),
    ("/", False),
    ("/etc", False),
    ("/etc/ddp", False),  # inside a system tree
    ("/usr/local/ddp", False),
    ("/var", False),
    ("/home", False),
    ("/root", False),
    ("/tmp", False),
    ("/run", False),
    ("/proc/1", False),
    ("/lib64", False),
    ("/srv", False),
    ("data", False),  # relative
    ("/data/", False),  # not normalised
    ("/data/../etc", False),
    ("//data", False),
    ("/my data", False),
    ("", False),
]


@pytest.mark.parametrize(("value", "ok"), SHARED_DIRS)
def test_shared_dir(value, ok):
    problems = v.shared_dir_problems(value, "shared_dir", "node0")
    assert (problems == []) is ok
    if not ok:
        assert problems[0].startswith(f"shared_dir={value} on node0: ")


def test_path_allows_system_dirs_but_only_absolute_normal_paths():
    assert v.path_problems("/var/tmp", "train_image_node_tmp_dir") == []
    assert "write it as /var/tmp" in v.path_problems("/var/tmp/", "train_image_node_tmp_dir")[0]


# --- NFS options -----------------------------------------------------------------------------------------------------
NFS_OPTIONS = [
    (["rw", "sync", "root_squash", "no_subtree_check"], False, []),
    (["rw", "sec=krb5p"], False, []),
    (["no_root_squash"], False, ["'no_root_squash'"]),
    (["rw", "insecure"], False, ["'insecure'"]),
    (["all_squash", "anonuid=1000"], False, ["'all_squash'", "'anonuid=1000'"]),
    (["no_root_squash", "insecure"], True, []),  # the flag says so
    (["rw) *(rw"], True, ["'rw) *(rw'"]),  # never allowed: it would end the option list
    (["noatime,nolock"], True, ["'noatime,nolock'"]),
]


@pytest.mark.parametrize(("options", "allow_weak", "named"), NFS_OPTIONS)
def test_nfs_options(options, allow_weak, named):
    problems = v.nfs_option_problems(options, "nfs_server_export_options", "node0", allow_weak=allow_weak)
    assert len(problems) == len(named), problems
    for problem, text in zip(problems, named, strict=True):
        assert problem.startswith(f"nfs_server_export_options entry {text} on node0: ")


# --- the inventory's groups and addresses ---------------------------------------------------------------------------
def test_cluster_addresses_and_duplicates():
    hostvars = {
        "node0": {"cluster_address": "10.0.0.1", "ansible_host": "a"},
        "node1": {"ansible_host": "10.0.0.1"},
        "node2": {},
    }
    addresses = v.cluster_addresses(["node0", "node1", "node2"], hostvars)
    assert addresses == {"node0": "10.0.0.1", "node1": "10.0.0.1", "node2": "node2"}
    assert v.duplicate_address_problems(addresses) == ["cluster_address=10.0.0.1 on node0 and node1"]


STORAGE = [
    (["n0"], ["n1"], ["n0", "n1"], None),
    ([], [], ["n0"], None),  # one machine needs no NFS
    ([], [], ["n0", "n1"], "group nfs_server holds 0 host(s) (none): the cluster (n0, n1)"),
    (["n0", "n1"], [], ["n0", "n1"], "group nfs_server holds 2 host(s) (n0, n1)"),
    (["n0"], ["n0", "n1"], ["n0", "n1"], "n0 is in both group nfs_server and group nfs_clients"),
]


@pytest.mark.parametrize(("servers", "clients", "cluster", "message"), STORAGE)
def test_storage_groups(servers, clients, cluster, message):
    groups = {"nfs_server": servers, "nfs_clients": clients, "cluster": cluster, "ungrouped": []}
    problems = v.storage_group_problems({name: hosts for name, hosts in groups.items() if hosts}, "/data")
    assert problems == [] if message is None else problems[0].startswith(message)


# --- renamed variables ----------------------------------------------------------------------------------------------
def test_a_variable_under_its_old_name_is_refused_naming_the_new_one():
    renamed = {"train_image": "train_image_name"}
    assert v.renamed_problems(["train_image_name", "train_image_variant"], renamed, "node0") == []
    assert v.renamed_problems(["train_image", "train_job_name"], renamed, "node0") == [
        "train_image on node0 is the old name of train_image_name, which nothing reads any more: "
        "set train_image_name instead."
    ]
