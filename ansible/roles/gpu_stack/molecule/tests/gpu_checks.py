"""What the gpu_stack scenarios look at on a node, and the consistency check as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
REPO = Path(os.environ.get("DDP_REPO_ROOT") or Path(__file__).resolve().parents[5])
CHECK_PLAYBOOK = REPO / "ansible/playbooks/check_versions.yml"
NODES = AnsibleRunner(INVENTORY).get_hosts("cluster")


def node(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def inventory_var(name: str, host: str | None = None):
    """A variable as the scenario's inventory writes it (scenario versions are literal there)."""
    return AnsibleRunner(INVENTORY).get_variables(host or NODES[0])[name]


def available_versions(host, package: str) -> list[str]:
    return host.check_output(f"apt-cache madison {package} | cut -d'|' -f2").split()


def run_check(*extra_args: str) -> subprocess.CompletedProcess:
    """ansible-playbook ansible/playbooks/check_versions.yml against the scenario's nodes."""
    command = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(Path(INVENTORY).parent),
        str(CHECK_PLAYBOOK),
        *extra_args,
    ]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
