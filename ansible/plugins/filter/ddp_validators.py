"""The project's input validators, written once: every role's tasks/validate.yml and the preflight use these.

Each validator returns a list of problems, one human-readable sentence per bad value, empty when all is well,
so that an assert can say `that: problems | length == 0` and print them. A sentence names the variable (`name`)
and, when given, the host (`host`): "firewall_ssh_port=0 on node0: not a port (1-65535)". The host is an
argument rather than added by the caller because it sits in the middle of the sentence.

Pure functions on plain values, no Ansible import: tests/unit/test_validators.py loads this file by path.
Ansible finds it through ansible.cfg (filter_plugins) and molecule/base.yml (ANSIBLE_FILTER_PLUGINS).
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

PORT_MIN, PORT_MAX = 1, 65535

# Directories that are the system's own: exporting or chowning one of them (or, for SYSTEM_TREES, anything
# below it) would hand the cluster user the machine. Subdirectories of the others (/srv/ddp, /home/ddp/data,
# /mnt/scratch, /var/nfs) are where shared data belongs and are fine.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
)
SYSTEM_DIRS = frozenset(
    (
        "/",
        *SYSTEM_TREES,
        "/home",
        "/media",
        "/mnt",
        "/opt",
        "/root",
        "/run",
        "/srv",
        "/tmp",
        "/var",
        "/var/lib",
        "/var/log",
        "/var/tmp",
    )
)

# Export options that let clients act as root or as someone else on the server, or skip its port check.
NFS_WEAK_OPTIONS = frozenset(
    ("no_root_squash", "all_squash", "anonuid", "anongid", "insecure", "insecure_locks", "no_auth_nlm")
)
# One export/mount option: a keyword or keyword=value, with nothing that could end the option list or the line.
_NFS_OPTION = re.compile(r"[a-z_0-9]+(=[A-Za-z0-9:._/@-]+)?")
# Debian's version syntax (epoch:upstream-revision), which every package manager here uses; it starts with a
# digit, so "latest", "stable" and operators (">=2.0") fail it, and "*" or "?" are not in its alphabet.
_VERSION = re.compile(r"([0-9]+:)?[0-9][0-9A-Za-z.+~-]*")
# With a revision: an upstream part with a dot, then "-revision" ("535.216.03-2~bpo12+1", "2.22.3-1-1").
_VERSION_WITH_REVISION = re.compile(r"([0-9]+:)?[0-9][0-9A-Za-z.+~-]*\.[0-9A-Za-z.+~-]*-[0-9A-Za-z.+~]+")
# A count of processes: a positive integer, as the inventory writes it.
_COUNT = re.compile(r"[1-9][0-9]*")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A plain name becomes a directory name with more after it (a run id is the job name and a time); well under
# NAME_MAX (255).
SAFE_NAME_MAX = 100
# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace.
_INTERFACE = re.compile(r"[A-Za-z0-9_.@-]{1,15}")


def _on(host: str) -> str:
    return f" on {host}" if host else ""


def _is_sequence(values: object) -> bool:
    return isinstance(values, Sequence) and not isinstance(values, str | bytes)


def parse_network(value: object, *, addresses: bool = True) -> Network:
    """The network a CIDR (or, with addresses, a single address) stands for. Raises ValueError with the reason.

    Strict: "10.0.0.1/24" is refused, never silently widened to 10.0.0.0/24, since whoever wrote it meant one
    of the two and the firewall and the exports would disagree on which."""
    text = str(value).strip() if value is not None else ""
    if not addresses and "/" not in text:
        raise ValueError("a single address, where a network a.b.c.d/n is needed")
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError("not an IP network (a.b.c.d/n or x:x::/n)") from None
    # ipaddress takes "fe80::1%eth0", which neither an nft set nor an exports line can hold.
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.scope_id is not None:
        raise ValueError("has a scope (zone) id, which a firewall rule or an export cannot hold")
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError:
        # The lenient parse above succeeded, so the strict one can only object to host bits.
        raise ValueError(f"has host bits set (the network would be {net})") from None
    return net


def address_problems(value: object, name: str, host: str = "") -> list[str]:
    """value must be one IP address (v4 or v6), not a name or a network."""
    try:
        ipaddress.ip_address(str(value).strip())
    except ValueError:
        return [f"{name}={value}{_on(host)}: not an IP address"]
    return []


def cidr_problems(
    values: object,
    name: str,
    host: str = "",
    *,
    family: int | None = None,
    addresses: bool = True,
    everyone: bool = False,
) -> list[str]:
    """values must be a list of CIDRs without host bits; family 4 or 6 admits only that IP version; addresses
    admits single addresses (as /32 or /128); everyone admits /0, which is every address of its family."""
    if not _is_sequence(values):
        return [f"{name}={values}{_on(host)}: not a list of networks"]
    problems = []
    for value in values:  # type: ignore[union-attr]
        try:
            net = parse_network(value, addresses=addresses)
        except ValueError as exc:
            problems.append(f"{name} entry {value}{_on(host)}: {exc}")
            continue
        if family is not None and net.version != family:
            problems.append(
                f"{name} entry {value}{_on(host)}: an IPv{net.version} network, where only IPv{family} is taken"
            )
        elif net.prefixlen == 0 and not everyone:
            problems.append(
                f"{name} entry {value}{_on(host)}: /0 is every IPv{net.version} address; name your networks"
            )
    return problems


def address_in_cidrs_problems(
    address: object, cidrs: Iterable[object], name: str, cidrs_name: str, host: str = ""
) -> list[str]:
    """address must lie in one of the CIDRs (entries that do not parse are another check's business)."""
    try:
        ip = ipaddress.ip_address(str(address).strip())
    except ValueError:
        return [f"{name}={address}{_on(host)}: not an IP address"]
    nets = []
    for cidr in cidrs:
        try:
            nets.append(parse_network(cidr))
        except ValueError:
            continue
    if any(ip in net for net in nets):
        return []
    shown = ", ".join(map(str, cidrs))
    return [
        f"{name}={address}{_on(host)} is not in {cidrs_name} ({shown}): "
        "the other nodes would refuse this node's own traffic"
    ]


def cidrs_of_family(values: Iterable[object], version: int) -> list[str]:
    """The entries of one IP version, normalised (single addresses as /32 or /128), for an nft set. An entry
    the checks refuse raises ValueError here too: a template that ran before them must fail, not widen."""
    return [str(net) for net in map(parse_network, values) if net.version == version]


def address_in(address: object, cidrs: Iterable[object]) -> bool:
    """Whether an address lies in any of the CIDRs, judged as nftables sees its packets: sshd on a dual-stack
    socket reports an IPv4 peer as IPv4-mapped IPv6 (::ffff:a.b.c.d), which is an IPv4 packet to the firewall."""
    ip = ipaddress.ip_address(str(address).strip())
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in parse_network(cidr) for cidr in cidrs)


def _port(value: object) -> int | None:
    text = str(value).strip()
    if not text.isdigit():
        return None
    port = int(text)
    return port if PORT_MIN <= port <= PORT_MAX else None


def port_problems(ports: Mapping[str, object], host: str = "") -> list[str]:
    """Every value must be a port, 1-65535; a list value (e.g. firewall_nfs_v3_ports) is checked entry by entry."""
    problems = []
    for name, value in ports.items():
        for port in value if _is_sequence(value) else [value]:  # type: ignore[union-attr]
            if _port(port) is None:
                problems.append(f"{name}={port}{_on(host)}: not a port ({PORT_MIN}-{PORT_MAX})")
    return problems


def port_range_problems(
    start: object,
    end: object,
    services: Mapping[str, object],
    host: str = "",
    *,
    start_name: str = "firewall_data_port_range_start",
    end_name: str = "firewall_data_port_range_end",
) -> list[str]:
    """start-end must be ports in order, holding no service port: the kernel hands ports of that range to any
    outgoing socket, so a service listening on one could find it taken, or be reached as a data port."""
    first, last = _port(start), _port(end)
    if first is None or last is None:
        return port_problems({start_name: start, end_name: end}, host)
    if first > last:
        return [f"{start_name}={start}{_on(host)} is above {end_name}={end}: the range is empty"]
    problems = []
    for name, value in services.items():
        for port in value if _is_sequence(value) else [value]:  # type: ignore[union-attr]
            if (number := _port(port)) is not None and first <= number <= last:
                problems.append(
                    f"{name}={port}{_on(host)} is also inside {_range_name(start_name)} ({first}-{last}), "
                    "the ports the kernel hands to NCCL and gloo sockets"
                )
    return problems


def _range_name(start_name: str) -> str:
    # firewall_data_port_range_start -> firewall_data_port_range_start-end, as the inventory spells both.
    return f"{start_name}-end" if start_name.endswith("_start") else start_name


def port_clash_problems(port: object, name: str, services: Mapping[str, object], host: str = "") -> list[str]:
    """port must be none of the named service ports (a list value names several)."""
    number = _port(port)
    clashes = [
        f"{other}={value}"
        for other, values in services.items()
        for value in (values if _is_sequence(values) else [values])  # type: ignore[union-attr]
        if number is not None and _port(value) == number
    ]
    if not clashes:
        return []
    return [f"{name}={port}{_on(host)} is also {' and '.join(clashes)}: it needs a port of its own"]


def interface_problems(names: object, name: str, host: str = "") -> list[str]:
    """Each entry must be a possible Linux interface name (what NCCL/GLOO_SOCKET_IFNAME name)."""
    problems = []
    for value in names if _is_sequence(names) else [names]:  # type: ignore[union-attr]
        if not _INTERFACE.fullmatch(str(value)):
            problems.append(f"{name}={value}{_on(host)}: not an interface name (1-15 letters, digits, _ . @ -)")
    return problems


def missing_interfaces(env: Mapping[str, object], interfaces: Iterable[str], host: str = "") -> list[str]:
    """The interfaces train_env's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name that the node lacks.

    NCCL takes prefixes ("eth" matches eth0) and "=name" for an exact name, and "^..." to exclude (not checked:
    excluding an absent interface is harmless); gloo takes exact names."""
    present = list(interfaces)
    problems = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = str(env.get(var, "")) if var in env else ""
        if not value or value.startswith("^"):
            continue
        for wanted in value.split(","):
            exact = var == "GLOO_SOCKET_IFNAME" or wanted.startswith("=")
            wanted_name = wanted.removeprefix("=")
            if not any(i == wanted_name if exact else i.startswith(wanted_name) for i in present):
                problems.append(f"{var}={wanted_name}")
    if not problems:
        return []
    return [f"{', '.join(problems)} in train_env{_on(host)}: no such interface (it has {', '.join(sorted(present))})"]


def version_problems(value: object, name: str, host: str = "", *, revision: bool = False) -> list[str]:
    """value must be one exact package version: no wildcard, range or operator, not 'latest'. With revision,
    also the Debian revision (apt's exact form, "2.22.3-1", not "2.22.3")."""
    text = "" if value is None else str(value).strip()
    pattern = _VERSION_WITH_REVISION if revision else _VERSION
    if pattern.fullmatch(text):
        return []
    form = "epoch:upstream-revision as `apt-cache policy` prints it" if revision else "digits and . + ~ - :"
    return [f"{name}='{text}'{_on(host)}: not an exact version ({form}; no wildcards, ranges or 'latest')"]


def versions_problems(
    versions: Mapping[str, object] | Iterable[Sequence[object]], host: str = "", *, revision: bool = False
) -> list[str]:
    """version_problems for each (name, value): a mapping, or pairs as Jinja's zip gives them."""
    pairs = versions.items() if isinstance(versions, Mapping) else versions
    return [problem for name, value in pairs for problem in version_problems(value, str(name), host, revision=revision)]


def nproc_problems(value: object, gpus: object = None, host: str = "", gpus_source: str = "gpu_count") -> list[str]:
    """train_nproc_per_node: 'auto' (one process per GPU) or a positive integer, and no more than the node's GPUs
    where it has any (gpus: the inventory's gpu_count, or the device nodes found on the node; None or 0 for a
    node without GPUs, whose processes run on its CPUs)."""
    text = "auto" if value is None else str(value)
    if text == "auto":
        return []
    if not _COUNT.fullmatch(text):
        return [f"train_nproc_per_node={text}{_on(host)}: must be 'auto' or a positive integer"]
    limit = int(gpus) if _COUNT.fullmatch(str(gpus)) else 0
    if limit and int(text) > limit:
        return [f"train_nproc_per_node={text}{_on(host)} is more than its {limit} GPU(s) ({gpus_source})"]
    return []


def safe_name_problems(value: object, name: str, host: str = "") -> list[str]:
    """value names one directory or file: letters, digits, '.', '_', '-', starting with a letter or digit, at most
    SAFE_NAME_MAX characters (so never '', '.', '..', anything with '/', or a trailing newline)."""
    text = "" if value is None else str(value)
    if _SAFE_NAME.fullmatch(text) and ".." not in text and len(text) <= SAFE_NAME_MAX:
        return []
    return [
        f"{name}={text}{_on(host)}: not a plain name (letters, digits, . _ -, starting with a letter or digit, "
        f"no '..', at most {SAFE_NAME_MAX} characters)"
    ]


def path_problems(value: object, name: str, host: str = "") -> list[str]:
    """value must be an absolute, normalised path (no '..', '//', '.', trailing '/', or whitespace)."""
    text = "" if value is None else str(value)
    if not text.startswith("/") or re.search(r"\s", text):
        return [f"{name}={text}{_on(host)}: not an absolute path without spaces"]
    normal = posixpath.normpath(text)
    if normal.startswith("//"):  # POSIX keeps a leading "//"; nobody means it
        normal = "/" + normal.lstrip("/")
    if normal != text:
        return [f"{name}={text}{_on(host)}: not a normalised path (write it as {normal})"]
    return []


def shared_dir_problems(value: object, name: str, host: str = "") -> list[str]:
    """value must be a directory fit to chown to the cluster user and export read-write: an absolute,
    normalised path that is neither a system directory (/, /etc, /var, /home, ...) nor inside a system tree
    (/etc, /usr, /boot, /proc, ...)."""
    problems = path_problems(value, name, host)
    if problems:
        return problems
    text = str(value)
    if text in SYSTEM_DIRS or any(text.startswith(tree + "/") for tree in SYSTEM_TREES):
        return [
            f"{name}={text}{_on(host)}: a system directory; the NFS server would give it to the cluster user and "
            "export it read-write. Use a directory of its own, e.g. /data or /srv/ddp"
        ]
    return []


def with_system_paths(spec: Mapping[str, object]) -> dict[str, object]:
    """spec with system_paths {dirs, trees} added: for a check that must run on the node, after resolving links
    there (the train role's preflight), the rule's lists as they are written here."""
    return {**spec, "system_paths": {"dirs": sorted(SYSTEM_DIRS), "trees": list(SYSTEM_TREES)}}


def nfs_option_problems(options: object, name: str, host: str = "", *, allow_weak: bool = False) -> list[str]:
    """Each entry must be one option (keyword or keyword=value, nothing that could end the option list); and,
    unless allow_weak, none of NFS_WEAK_OPTIONS, which give clients root's or another user's access."""
    if not _is_sequence(options):
        return [f"{name}={options}{_on(host)}: not a list of options"]
    problems = []
    for option in options:  # type: ignore[union-attr]
        text = str(option)
        if not _NFS_OPTION.fullmatch(text):
            problems.append(f"{name} entry '{text}'{_on(host)}: not one option (keyword or keyword=value)")
        elif text.split("=", maxsplit=1)[0] in NFS_WEAK_OPTIONS and not allow_weak:
            problems.append(
                f"{name} entry '{text}'{_on(host)}: weakens root squashing or the port check, so a client could "
                "act as root or as another user on the server (set nfs_server_allow_weak_options: true if meant)"
            )
    return problems


def cluster_addresses(hosts: Iterable[str], hostvars: Mapping[str, Mapping[str, object]]) -> dict[str, str]:
    """Each host's address as the inventory gives it: cluster_address, else ansible_host, else its name."""
    addresses = {}
    for host in hosts:
        node = hostvars[host]
        found = next((node[key] for key in ("cluster_address", "ansible_host") if key in node), host)
        addresses[host] = str(found)
    return addresses


def duplicate_address_problems(addresses: Mapping[str, object], name: str = "cluster_address") -> list[str]:
    """addresses: host -> its address. One problem per address that two or more hosts share."""
    by_address: dict[str, list[str]] = {}
    for node, address in addresses.items():
        by_address.setdefault(str(address), []).append(node)
    return [f"{name}={address} on {' and '.join(nodes)}" for address, nodes in by_address.items() if len(nodes) > 1]


def storage_group_problems(groups: Mapping[str, Sequence[str]], shared_dir: object = "") -> list[str]:
    """groups: the inventory's groups. Exactly one NFS server (none only for a one-node cluster without NFS
    clients), and it must not be its own client. The preflight and the storage stage both check this."""
    servers, clients = list(groups.get("nfs_server", [])), list(groups.get("nfs_clients", []))
    cluster = list(groups.get("cluster", []))
    both = [host for host in servers if host in clients]
    if both:
        return [
            f"{', '.join(both)} is in both group nfs_server and group nfs_clients: "
            "the NFS server must not mount itself."
        ]
    if len(servers) == 1 or (not servers and not clients and len(cluster) <= 1):
        return []
    return [
        f"group nfs_server holds {len(servers)} host(s) ({', '.join(servers) or 'none'}): the cluster "
        f"({', '.join(cluster)}) needs exactly one NFS server for shared_dir={shared_dir}."
    ]


def renamed_problems(names: Iterable[str], renamed: Mapping[str, str], host: str = "") -> list[str]:
    """names: the variables set (for this host). renamed: old name -> new name. A value under an old name is read
    by nothing, so the new name's default would win in silence: each old name found is refused, naming the new one."""
    return [
        f"{old}{_on(host)} is the old name of {renamed[old]}, which nothing reads any more: set {renamed[old]} instead."
        for old in sorted(set(names) & set(renamed))
    ]


class FilterModule:
    def filters(self) -> dict[str, Callable[..., object]]:
        return {
            "ddp_address_problems": address_problems,
            "ddp_cidr_problems": cidr_problems,
            "ddp_address_in_cidrs_problems": address_in_cidrs_problems,
            "ddp_cidrs_of_family": cidrs_of_family,
            "ddp_address_in": address_in,
            "ddp_port_problems": port_problems,
            "ddp_port_range_problems": port_range_problems,
            "ddp_port_clash_problems": port_clash_problems,
            "ddp_interface_problems": interface_problems,
            "ddp_missing_interfaces": missing_interfaces,
            "ddp_version_problems": version_problems,
            "ddp_versions_problems": versions_problems,
            "ddp_safe_name_problems": safe_name_problems,
            "ddp_nproc_problems": nproc_problems,
            "ddp_path_problems": path_problems,
            "ddp_shared_dir_problems": shared_dir_problems,
            "ddp_with_system_paths": with_system_paths,
            "ddp_nfs_option_problems": nfs_option_problems,
            "ddp_cluster_addresses": cluster_addresses,
            "ddp_duplicate_address_problems": duplicate_address_problems,
            "ddp_storage_group_problems": storage_group_problems,
            "ddp_renamed_problems": renamed_problems,
        }
