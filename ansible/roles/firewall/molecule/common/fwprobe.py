"""Helpers the firewall scenarios share: listeners on a node, connection probes, playbook runs."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import testinfra
from nftrules import verdict
from testhosts import container

ROOT = Path(os.environ["DDP_REPO_ROOT"])
INVENTORY_DIR = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
PLAYBOOK = ROOT / "ansible/playbooks/firewall.yml"
TABLE = "inet ddp_cluster"
RULES_FILE = "/etc/nftables.d/ddp-cluster.nft"
LAST_GOOD = "/var/lib/ddp-firewall/last-good.nft"
# A dropped SYN is never answered; on the test bridge an open port answers within milliseconds.
CONNECT_TIMEOUT_S = 1
# probe(): a longer wait and retries for what must be open, as a loaded CI machine can be slow to answer.
PROBE_TIMEOUT_S, PROBE_TRIES = 3, 3
# Run on the probing node: connects to (or, for UDP, sends a datagram to the echo listener at) every
# proto/port of argv[1] at once and prints which answered, as JSON.
_PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
target, timeout = sys.argv[1], float(sys.argv[2])
def answers(key):
    proto, port = key.split("/")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.connect((target, int(port)))
        if proto == "udp":
            s.send(b"probe")
            s.recv(64)
        return True
    except OSError:
        return False
    finally:
        s.close()
keys = sys.argv[3:]
with ThreadPoolExecutor(len(keys)) as pool:
    print(json.dumps(dict(zip(keys, pool.map(answers, keys)))))
"""
# A UDP echo server, the listener a UDP probe needs to get an answer.
_UDP_ECHO = (
    "import socket,sys; s=socket.socket(2,2); s.bind(('',int(sys.argv[1])));"
    " [s.sendto(*s.recvfrom(64)) for _ in iter(int,1)]"
)


def node(name: str) -> testinfra.host.Host:
    """A test host reached with `docker exec` (fast; the firewall never sees this path)."""
    return testinfra.get_host(f"docker://{container(name)}")


def address(name: str) -> str:
    return node(name).interface("eth0").addresses[0]


def wait_booted(name: str) -> None:
    """Waits for systemd to finish booting a (re)started test host; its bus takes a moment to appear."""
    state = ""
    for _ in range(60):
        state = node(name).run("systemctl is-system-running --wait").stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{name} did not boot: {state!r}")


@contextmanager
def listening(name: str, ports: Iterable[int], udp_ports: Iterable[int] = ()) -> Iterator[None]:
    """TCP listeners (and UDP echo listeners) on a node as transient units, proven up over loopback,
    removed afterwards."""
    host = node(name)
    units = {f"tcp/{port}": f"fw-test-listen-{port}" for port in ports}
    units |= {f"udp/{port}": f"fw-test-listen-udp-{port}" for port in udp_ports}
    try:
        for key, unit in units.items():
            proto, port = key.split("/")
            server = f"nc -lk {port}" if proto == "tcp" else f"python3 -c {shlex.quote(_UDP_ECHO)} {port}"
            host.run_expect([0], f"systemd-run --unit={unit} --collect {server}")
        for _ in range(50):
            up = _probe_once(host, "127.0.0.1", list(units), 1)
            if all(up.values()):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"no listener came up on {name}: {[k for k, ok in up.items() if not ok]}")
        yield
    finally:
        host.run("systemctl stop " + " ".join(units.values()))


def _probe_once(host: testinfra.host.Host, target: str, keys: list[str], timeout: float) -> dict[str, bool]:
    out = host.check_output(f"python3 -c {shlex.quote(_PROBE)} {target} {timeout} {' '.join(keys)}")
    return json.loads(out)


def probe(peer: str, target: str, expected: dict[str, bool]) -> dict[str, bool]:
    """Which of target's "tcp/PORT" / "udp/PORT" answer a peer node, all probed at once. What is expected
    to answer and does not is tried again (PROBE_TRIES in all), so a slow machine does not fail the test;
    what is expected closed is probed once, a dropped packet being silence for PROBE_TIMEOUT_S."""
    host = node(peer)
    seen = _probe_once(host, target, list(expected), PROBE_TIMEOUT_S)
    for _ in range(PROBE_TRIES - 1):
        retry = [k for k, ok in seen.items() if expected[k] and not ok]
        if not retry:
            break
        seen |= _probe_once(host, target, retry, PROBE_TIMEOUT_S)
    return seen


def reachable_from(peer: str, target: str, ports: Iterable[int]) -> dict[int, bool]:
    """Which TCP ports of target a peer node can connect to (all probes at once)."""
    ports = list(ports)
    probes = " ".join(
        f"(nc -z -w {CONNECT_TIMEOUT_S} {target} {p} && echo {p} open || echo {p} closed) &" for p in ports
    )
    out = node(peer).check_output(f"{probes} wait")
    states = dict(line.split() for line in out.splitlines())
    return {p: states[str(p)] == "open" for p in ports}


def reachable_from_controller(target: str, ports: Iterable[int]) -> dict[int, bool]:
    """Which TCP ports of target this controller (the test network's gateway address) can connect to."""

    def connects(port: int) -> bool:
        try:
            socket.create_connection((target, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError:
            return False
        return True

    ports = list(ports)
    with ThreadPoolExecutor(len(ports)) as pool:
        return dict(zip(ports, pool.map(connects, ports), strict=True))


def table_listing(name: str) -> str:
    return node(name).check_output(f"nft list table {TABLE}")


def node_state(name: str) -> tuple[str, str]:
    """What a failed run must leave alone: the loaded table and the ruleset file."""
    return table_listing(name), node(name).file(RULES_FILE).content_string


def run_playbook(
    extravars: dict[str, object] | None = None, limit: str | None = None, extra_inventory: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the firewall stage playbook against the scenario's hosts, as an operator would. An extra
    inventory (read last, so its host variables win) can change how the hosts are reached."""
    command = ["ansible-playbook", "-i", str(INVENTORY_DIR), str(PLAYBOOK)]
    if extra_inventory:
        command[3:3] = ["-i", str(extra_inventory)]
    if extravars:
        command += ["-e", json.dumps(extravars)]
    if limit:
        command += ["--limit", limit]
    env = os.environ | {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)


def recap_changed(result: subprocess.CompletedProcess[str]) -> list[int]:
    """The changed= counts of the play recap, one per host."""
    return [
        int(field.split("=")[1])
        for line in result.stdout.splitlines()
        if " : ok=" in line
        for field in line.split()
        if field.startswith("changed=")
    ]


def assert_unit_stopped(name: str, unit: str) -> None:
    """A unit that exists and is not active: "not running" alone also holds for a unit that was never
    installed (a misspelt name, a template that was not written)."""
    out = node(name).check_output(f"systemctl show -p LoadState -p ActiveState {unit}")
    state = dict(line.split("=", 1) for line in out.splitlines())
    assert state == {"LoadState": "loaded", "ActiveState": "inactive"}, f"{name}: {unit}: {state}"


def decisions(name: str, keys: Iterable[str], sources: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """What name's loaded table decides for a new packet to each "tcp/PORT" / "udp/PORT" from each source
    address, in order (nftrules: how IPv6, which the test network lacks, is checked)."""
    listing = node(name).check_output(f"nft -j list table {TABLE}")
    sources = list(sources)
    return {
        key: tuple(verdict(listing, src, key.split("/")[0], int(key.split("/")[1])) for src in sources) for key in keys
    }
