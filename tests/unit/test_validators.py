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
NOT_A_NETWORK = "not an IP network (a.b.c.d/n or x:x::/n)"
SCOPE = "has a scope (zone) id, which a firewall rule or an export cannot hold"
CIDRS_BAD = [
    # (entry, options, the reason the message gives)
    ("10.0.0.1/24", {}, "has host bits set (the network would be 10.0.0.0/24)"),
    ("fd00::1/8", {}, "has host bits set (the network would be fd00::/8)"),
    ("999.1.1.1/99", {}, NOT_A_NETWORK),  # ssh_mesh's old regex let this through
    ("10.0.0.300/24", {}, NOT_A_NETWORK),
    ("10.0.0.0/33", {}, NOT_A_NETWORK),
    ("2001:db8::/129", {}, NOT_A_NETWORK),
    ("node1.example/24", {}, NOT_A_NETWORK),
    ("", {}, NOT_A_NETWORK),
    (None, {}, NOT_A_NETWORK),
    ("fe80::1%eth0", {}, SCOPE),
    ("fe80::%eth0/64", {}, SCOPE),
    ("0.0.0.0/0", {}, "/0 is every IPv4 address; name your networks"),
    ("::/0", {}, "/0 is every IPv6 address; name your networks"),  # as much "everyone" as 0.0.0.0/0
    ("::/0", {"family": 4, "everyone": True}, "an IPv6 network, where only IPv4 is taken"),
    ("10.213.50.0", {"addresses": False}, "a single address, where a network a.b.c.d/n is needed"),
]


@pytest.mark.parametrize(("value", "options"), CIDRS_OK)
def test_cidrs_accepted(value, options):
    assert v.cidr_problems([value], "cluster_cidrs", "node0", **options) == []


@pytest.mark.parametrize(("value", "options", "reason"), CIDRS_BAD)
def test_cidrs_refused_naming_entry_variable_and_host(value, options, reason):
    assert v.cidr_problems([value], "admin_cidrs", "node1", **options) == [
        f"admin_cidrs entry {value} on node1: {reason}"
    ]


def test_cidrs_one_problem_per_bad_entry_and_not_a_list_refused():
    assert len(v.cidr_problems(["10.0.0.0/8", "10.0.0.1/8", "::/0", "x"], "c")) == 3
    assert v.cidr_problems("10.0.0.0/8", "cluster_cidrs", "n") == [
        "cluster_cidrs=10.0.0.0/8 on n: not a list of networks"
    ]


# --- addresses ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "ok"), [("10.0.0.1", True), ("::1", True), ("node0", False), ("10.0.0.0/8", False)])
def test_address(value, ok):
    expected = [] if ok else [f"cluster_address={value} on node0: not an IP address"]
    assert v.address_problems(value, "cluster_address", "node0") == expected


REFUSED = "the other nodes would refuse this node's own traffic"
ADDRESS_IN: list[tuple[str, list[str], str | None]] = [
    # (address, cidrs, the problem; None: inside)
    ("127.0.0.2", ["127.0.0.0/8"], None),
    ("10.0.0.5", ["192.168.0.0/16", "10.0.0.0/24"], None),
    ("2001:db8::5", ["2001:db8::/32"], None),
    ("10.0.0.5", ["garbage", "10.0.0.0/24"], None),  # a bad entry hides none of the entries after it
    (
        "127.0.0.2",
        ["10.0.0.0/8"],
        f"ssh_mesh_address=127.0.0.2 on node0 is not in ssh_mesh_allowed_cidrs (10.0.0.0/8): {REFUSED}",
    ),
    # a bad entry is the CIDR check's to name; here it is only shown among the rest
    (
        "10.0.1.5",
        ["10.0.0.0/24", "garbage"],
        f"ssh_mesh_address=10.0.1.5 on node0 is not in ssh_mesh_allowed_cidrs (10.0.0.0/24, garbage): {REFUSED}",
    ),
    ("node0", ["10.0.0.0/8"], "ssh_mesh_address=node0 on node0: not an IP address"),
]


@pytest.mark.parametrize(("address", "cidrs", "problem"), ADDRESS_IN)
def test_address_in_cidrs(address, cidrs, problem):
    problems = v.address_in_cidrs_problems(address, cidrs, "ssh_mesh_address", "ssh_mesh_allowed_cidrs", "node0")
    assert problems == ([] if problem is None else [problem])


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
    (
        {"NCCL_SOCKET_IFNAME": "=eth", "GLOO_SOCKET_IFNAME": "eth1"},
        ["NCCL_SOCKET_IFNAME=eth", "GLOO_SOCKET_IFNAME=eth1"],
    ),
]


@pytest.mark.parametrize(("env", "missing"), MISSING)
def test_missing_interfaces(env, missing):
    problems = v.missing_interfaces(env, ["lo", "eth0"], "node1")
    # One sentence for all of them, naming what the node has (sorted).
    expected = [f"{', '.join(missing)} in train_env on node1: no such interface (it has eth0, lo)"] if missing else []
    assert problems == expected


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


# The form the message asks for: apt's exact form where a revision is needed, else the version's alphabet.
APT_FORM = "epoch:upstream-revision as `apt-cache policy` prints it"
PLAIN_FORM = "digits and . + ~ - :"


@pytest.mark.parametrize(("value", "revision", "ok"), VERSIONS)
def test_exact_version(value, revision, ok):
    problems = v.version_problems(value, "docker_version", "node0", revision=revision)
    form = APT_FORM if revision else PLAIN_FORM
    message = (
        f"docker_version='{value or ''}' on node0: not an exact version ({form}; no wildcards, ranges or 'latest')"
    )
    assert problems == ([] if ok else [message])


def test_versions_of_several_variables_as_pairs_or_mapping():
    pairs = [["gpu_stack_cuda_version", "12.4"], ["gpu_stack_nccl_version", "2.21.5-1+cuda12.4"]]
    assert v.versions_problems(pairs, revision=True) == v.versions_problems(dict(pairs), revision=True)
    (problem,) = v.versions_problems(pairs, revision=True)
    assert problem.startswith(f"gpu_stack_cuda_version='12.4': not an exact version ({APT_FORM}; ")


def test_a_revision_is_only_required_when_asked_for():
    # docker's role passes no revision: "27.3.1" is its exact form.
    assert v.version_problems("27.3.1", "docker_version") == []
    assert v.versions_problems({"docker_version": "27.3.1"}) == []
    assert v.versions_problems({"docker_version": "27.3.1"}, revision=True) != []


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
        (".hidden", False),
        ("job\n", False),  # matched in full: a trailing newline is no part of a name
        ("x" * 100, True),
        ("x" * 101, False),
        ("local-smoke-20261204-221410", True),
    ],
)
def test_safe_name(value, ok):
    reason = (
        "not a plain name (letters, digits, . _ -, starting with a letter or digit, no '..', at most 100 characters)"
    )
    expected = [] if ok else [f"train_job_name={value or ''} on n: {reason}"]
    assert v.safe_name_problems(value, "train_job_name", "n") == expected


SYSTEM = (
    "a system directory; the NFS server would give it to the cluster user and export it read-write. "
    "Use a directory of its own, e.g. /data or /srv/ddp"
)
NOT_ABSOLUTE = "not an absolute path without spaces"
SHARED_DIRS: list[tuple[str | None, str | None]] = [
    # (value, the reason it is refused; None: accepted)
    ("/data", None),
    ("/srv/ddp", None),
    ("/mnt/scratch", None),
    ("/home/ddp/shared", None),
    ("/var/nfs/ddp", None),
    ("/opt/ddp", None),
    ("/", SYSTEM),
    ("/etc", SYSTEM),
    ("/etc/ddp", SYSTEM),  # inside a system tree
    ("/usr/local/ddp", SYSTEM),
    ("/var", SYSTEM),
    ("/home", SYSTEM),
    ("/root", SYSTEM),
    ("/tmp", SYSTEM),
    ("/run", SYSTEM),
    ("/proc/1", SYSTEM),
    ("/lib64", SYSTEM),
    ("/srv", SYSTEM),
    ("/bin", SYSTEM),
    ("/boot", SYSTEM),
    ("/dev", SYSTEM),
    ("/lib", SYSTEM),
    ("/lib32", SYSTEM),
    ("/libx32", SYSTEM),
    ("/sbin", SYSTEM),
    ("/sys", SYSTEM),
    ("/media", SYSTEM),
    ("/mnt", SYSTEM),
    ("/opt", SYSTEM),
    ("/var/lib", SYSTEM),
    ("/var/log", SYSTEM),
    ("/var/tmp", SYSTEM),
    ("data", NOT_ABSOLUTE),  # relative
    ("/my data", NOT_ABSOLUTE),
    ("", NOT_ABSOLUTE),
    (None, NOT_ABSOLUTE),
    ("/data/", "not a normalised path (write it as /data)"),
    ("/data/../etc", "not a normalised path (write it as /etc)"),
    ("//data", "not a normalised path (write it as /data)"),  # POSIX keeps a leading //
    ("//Xilinx", "not a normalised path (write it as /Xilinx)"),  # only the slashes go, never the name
]


@pytest.mark.parametrize(("value", "reason"), SHARED_DIRS)
def test_shared_dir(value, reason):
    expected = [] if reason is None else [f"shared_dir={value or ''} on node0: {reason}"]
    assert v.shared_dir_problems(value, "shared_dir", "node0") == expected


def test_path_allows_system_dirs_but_only_absolute_normal_paths():
    assert v.path_problems("/var/tmp", "train_image_node_tmp_dir") == []
    assert v.path_problems("/var/tmp/", "train_image_node_tmp_dir") == [
        "train_image_node_tmp_dir=/var/tmp/: not a normalised path (write it as /var/tmp)"
    ]


# --- NFS options -----------------------------------------------------------------------------------------------------
WEAK = (
    "weakens root squashing or the port check, so a client could act as root or as another user on the server "
    "(set nfs_server_allow_weak_options: true if meant)"
)
NOT_ONE = "not one option (keyword or keyword=value)"
NFS_OPTIONS = [
    # (options, allow_weak, (entry, reason) for each refused entry)
    (["rw", "sync", "root_squash", "no_subtree_check"], False, []),
    (["rw", "sec=krb5p"], False, []),
    (["no_root_squash"], False, [("no_root_squash", WEAK)]),
    (["rw", "insecure"], False, [("insecure", WEAK)]),
    (["all_squash", "anonuid=1000"], False, [("all_squash", WEAK), ("anonuid=1000", WEAK)]),
    (["anongid=1000"], False, [("anongid=1000", WEAK)]),
    (["insecure_locks"], False, [("insecure_locks", WEAK)]),
    (["no_auth_nlm"], False, [("no_auth_nlm", WEAK)]),
    (["no_root_squash", "insecure"], True, []),  # the flag says so
    (["rw) *(rw"], True, [("rw) *(rw", NOT_ONE)]),  # never allowed: it would end the option list
    (["noatime,nolock"], True, [("noatime,nolock", NOT_ONE)]),
]


@pytest.mark.parametrize(("options", "allow_weak", "refused"), NFS_OPTIONS)
def test_nfs_options(options, allow_weak, refused):
    problems = v.nfs_option_problems(options, "nfs_server_export_options", "node0", allow_weak=allow_weak)
    assert problems == [f"nfs_server_export_options entry '{text}' on node0: {reason}" for text, reason in refused]


def test_nfs_options_weak_ones_refused_unless_allowed_and_a_string_is_no_list():
    assert v.nfs_option_problems(["no_root_squash"], "nfs_server_export_options", "node0") == [
        f"nfs_server_export_options entry 'no_root_squash' on node0: {WEAK}"
    ]
    # "rw,sync" written as one string would be read letter by letter
    assert v.nfs_option_problems("rw,sync", "nfs_client_extra_options", "node0") == [
        "nfs_client_extra_options=rw,sync on node0: not a list of options"
    ]


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
    ([], ["n0"], ["n0"], "group nfs_server holds 0 host(s) (none): the cluster (n0)"),  # but clients need a server
    ([], [], ["n0", "n1"], "group nfs_server holds 0 host(s) (none): the cluster (n0, n1)"),
    (["n0", "n1"], [], ["n0", "n1"], "group nfs_server holds 2 host(s) (n0, n1)"),
    (["n0"], ["n0", "n1"], ["n0", "n1"], "n0 is in both group nfs_server and group nfs_clients"),
]


@pytest.mark.parametrize(("servers", "clients", "cluster", "message"), STORAGE)
def test_storage_groups(servers, clients, cluster, message):
    groups = {"nfs_server": servers, "nfs_clients": clients, "cluster": cluster, "ungrouped": []}
    problems = v.storage_group_problems({name: hosts for name, hosts in groups.items() if hosts}, "/data")
    assert problems == [] if message is None else problems[0].startswith(message)


def test_storage_groups_without_shared_dir():
    # The preflight passes shared_dir | default(''): an unset shared_dir is shown as empty.
    assert v.storage_group_problems({"cluster": ["n0", "n1"]}) == [
        "group nfs_server holds 0 host(s) (none): the cluster (n0, n1) needs exactly one NFS server for shared_dir=."
    ]


# --- renamed variables ----------------------------------------------------------------------------------------------
def test_a_variable_under_its_old_name_is_refused_naming_the_new_one():
    renamed = {"train_image": "train_image_name"}
    assert v.renamed_problems(["train_image_name", "train_image_variant"], renamed, "node0") == []
    assert v.renamed_problems(["train_image", "train_job_name"], renamed, "node0") == [
        "train_image on node0 is the old name of train_image_name, which nothing reads any more: "
        "set train_image_name instead."
    ]


# --- without a host ---------------------------------------------------------------------------------------------------
# The role-level checks of inventory-wide settings pass no host: the sentence then has no " on <host>" part.
NO_HOST = [
    # (validator, its arguments, how its one problem starts)
    (v.address_problems, ("node0", "cluster_address"), "cluster_address=node0: not an IP address"),
    (v.cidr_problems, (["x"], "cluster_cidrs"), f"cluster_cidrs entry x: {NOT_A_NETWORK}"),
    (
        v.address_in_cidrs_problems,
        ("10.0.1.5", ["10.0.0.0/24"], "ssh_mesh_address", "ssh_mesh_allowed_cidrs"),
        "ssh_mesh_address=10.0.1.5 is not in ssh_mesh_allowed_cidrs (10.0.0.0/24): ",
    ),
    (v.port_problems, ({"rendezvous_port": 0},), "rendezvous_port=0: not a port"),
    (v.port_range_problems, (2, 1, {}), "firewall_data_port_range_start=2 is above firewall_data_port_range_end=1: "),
    (v.port_clash_problems, (22, "rendezvous_port", SERVICES), "rendezvous_port=22 is also firewall_ssh_port=22: "),
    (v.interface_problems, ("eth 0", "GLOO_SOCKET_IFNAME"), "GLOO_SOCKET_IFNAME=eth 0: not an interface name"),
    (v.missing_interfaces, ({"GLOO_SOCKET_IFNAME": "eth9"}, ["eth0"]), "GLOO_SOCKET_IFNAME=eth9 in train_env: "),
    (v.version_problems, ("latest", "docker_version"), "docker_version='latest': not an exact version"),
    (v.versions_problems, ({"docker_version": "latest"},), "docker_version='latest': not an exact version"),
    (v.safe_name_problems, ("..", "train_job_name"), "train_job_name=..: not a plain name"),
    (v.path_problems, (None, "train_image_node_tmp_dir"), f"train_image_node_tmp_dir=: {NOT_ABSOLUTE}"),
    (v.shared_dir_problems, ("/etc", "shared_dir"), f"shared_dir=/etc: {SYSTEM}"),
    (v.nfs_option_problems, (["rw)"], "nfs_client_extra_options"), f"nfs_client_extra_options entry 'rw)': {NOT_ONE}"),
    (
        v.renamed_problems,
        (["train_image"], {"train_image": "train_image_name"}),
        "train_image is the old name of train_image_name, ",
    ),
]


@pytest.mark.parametrize(("validator", "args", "start"), NO_HOST, ids=[row[0].__name__ for row in NO_HOST])
def test_without_a_host_the_sentence_names_none(validator, args, start):
    (problem,) = validator(*args)
    assert problem.startswith(start)


@pytest.mark.parametrize(
    ("value", "gpus", "source", "problem"),
    [
        ("auto", 4, "gpu_count", None),
        (None, None, "gpu_count", None),
        (4, 4, "gpu_count", None),
        ("2", None, "gpu_count", None),
        (8, 0, "device nodes", None),  # no GPUs: its processes run on the CPUs, no bound
        (8, 4, "gpu_count", "train_nproc_per_node=8 on n1 is more than its 4 GPU(s) (gpu_count)"),
        (3, "2", "device nodes", "train_nproc_per_node=3 on n1 is more than its 2 GPU(s) (device nodes)"),
        (0, 4, "gpu_count", "train_nproc_per_node=0 on n1: must be 'auto' or a positive integer"),
        ("04", None, "gpu_count", "train_nproc_per_node=04 on n1: must be 'auto' or a positive integer"),
        ("2\n", None, "gpu_count", "train_nproc_per_node=2\n on n1: must be 'auto' or a positive integer"),
        ("all", 4, "gpu_count", "train_nproc_per_node=all on n1: must be 'auto' or a positive integer"),
    ],
)
def test_nproc(value, gpus, source, problem):
    assert v.nproc_problems(value, gpus, "n1", source) == ([problem] if problem else [])
    assert v.nproc_problems(value, gpus, "", source) == ([problem.replace(" on n1", "")] if problem else [])
