"""What the unit tests that run this repository's playbooks share: a host that is this machine, an inventory
written from Python, and one way to run a playbook and read what it did. conftest.py offers run_playbook as the
`playbook` fixture."""

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import ansible_runner
import yaml

ROOT = Path(__file__).resolve().parents[2]
# This machine, reached without SSH, its modules run by the tests' own Python (the venv's, which has Ansible).
LOCAL_HOST = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
RECAP_LINE = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    output: str
    events: list[dict]

    def started_task_files(self) -> set[str]:
        """The task files (task_path without its line) of every task that started: which part of a role ran,
        whatever its tasks are called."""
        paths = (e["event_data"].get("task_path") or "" for e in self.events if e["event"] == "playbook_on_task_start")
        return {path.rpartition(":")[0] for path in paths}

    def started_any_of(self, role_task_file: str) -> bool:
        """Whether a task of ansible/roles/<role_task_file> (e.g. 'train/tasks/run.yml') started."""
        return any(path.endswith("/roles/" + role_task_file) for path in self.started_task_files())

    def changed_results(self) -> list[dict]:
        return [e for e in self.events if e["event"] == "runner_on_ok" and e["event_data"]["res"].get("changed")]

    def changed_per_host(self) -> dict[str, int]:
        """The PLAY RECAP's changed count per host."""
        recap = self.output[self.output.index("PLAY RECAP") :]
        return {host: int(changed) for host, changed in RECAP_LINE.findall(recap)}


def write_inventory(
    directory: Path, hosts: dict[str, dict], groups: dict[str, Iterable[str]], group_vars: dict | None = None
) -> Path:
    """directory/hosts.yml (hosts with their variables, groups by member name) and group_vars/all/main.yml."""
    (directory / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    children = {name: {"hosts": dict.fromkeys(members)} for name, members in groups.items()}
    (directory / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts, "children": children}}))
    (directory / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(group_vars or {}))
    return directory


def run_playbook(playbook: Path | str, inventory: Path, *options: str, private_dir: Path) -> PlaybookRun:
    """ansible-playbook PLAYBOOK (relative to the repository root, or absolute) -i INVENTORY OPTIONS..., with
    this repository's ansible.cfg and roles."""
    private_dir.mkdir(parents=True)
    run = ansible_runner.run(
        private_data_dir=str(private_dir),
        playbook=str(ROOT / playbook),
        inventory=str(inventory),
        cmdline=" ".join(options) or None,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
            "ANSIBLE_NOCOLOR": "1",
        },
        quiet=True,
        timeout=600,
    )
    return PlaybookRun(run.rc, run.stdout.read(), list(run.events))
