"""Helpers the firewall scenarios share: listeners on a node, connection probes, playbook runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import testinfra

ROOT = Path(os.environ["DDP_REPO_ROOT"])
INVENTORY_DIR = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
PLAYBOOK = ROOT / "ansible/playbooks/firewall.yml"
TABLE = "inet ddp_cluster"
RULES_FILE = "/etc/nftables.d/ddp-cluster.nft"
LAST_GOOD = "/var/lib/ddp-firewall/last-good.nft"
# A dropped SYN is never answered; on the test bridge an open port answers within milliseconds.
CONNECT_TIMEOUT_S = 1


def node(name: str) -> testinfra.host.Host:
    """A test host reached with `docker exec` (fast; the firewall never sees this path)."""
    return testinfra.get_host(f"docker://{name}")


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
def listening(name: str, ports: Iterable[int]) -> Iterator[None]:
    """TCP listeners on a node as transient units, proven up over loopback, removed afterwards."""
    host = node(name)
    units = {port: f"fw-test-listen-{port}" for port in ports}
    try:
        for port, unit in units.items():
            host.run_expect([0], f"systemd-run --unit={unit} --collect nc -lk {port}")
        for port in units:
            for _ in range(50):
                if host.run(f"nc -z -w 1 127.0.0.1 {port}").rc == 0:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"no listener came up on {name}:{port}")
        yield
    finally:
        host.run("systemctl stop " + " ".join(units.values()))


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
