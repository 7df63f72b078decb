"""A scenario that installs a package refreshes apt's lists in the same task.

Test hosts start without package lists (molecule/images/build.sh stamps them never-refreshed and checks the
built image), as a new machine does. An install that leans on lists left by an earlier run, or skips the refresh
through cache_valid_time, passes only where such state happens to exist: CI on a new machine once failed on it
(`No package matching 'iperf3' is available`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _yaml_tasks import tasks_in

ROOT = Path(__file__).resolve().parents[2]
APT_MODULES = ("ansible.builtin.apt", "apt")


def scenario_playbooks() -> list[Path]:
    return sorted(ROOT.glob("ansible/roles/*/molecule/*/*.yml")) + sorted(ROOT.glob("molecule/shared/*.yml"))


def installs_without_refresh(task: dict) -> str | None:
    """Why this task would install a package from whatever lists the host happens to have, or None."""
    module = next((name for name in APT_MODULES if name in task), None)
    if module is None or not isinstance(task[module], dict):
        return None
    args = task[module]
    if not any(args.get(key) for key in ("name", "pkg", "package", "deb")) or args.get("state") == "absent":
        return None
    if args.get("update_cache") is not True:
        return "installs without update_cache: true"
    if "cache_valid_time" in args:
        return "skips the refresh through cache_valid_time (a fresh host's lists are empty, not recent)"
    return None


def test_the_scenarios_are_found() -> None:
    assert any(path.name == "prepare.yml" for path in scenario_playbooks())


@pytest.mark.parametrize("path", scenario_playbooks(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_scenario_install_refreshes_the_lists(path: Path) -> None:
    playbook = yaml.safe_load(path.read_text())
    problems = [
        f"{task.get('name', '?')}: {why}" for task in tasks_in(playbook) if (why := installs_without_refresh(task))
    ]
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        ({"name": "iperf3"}, True),
        ({"name": "iperf3", "update_cache": True, "cache_valid_time": 3600}, True),
        ({"name": ["gpg"], "update_cache": True}, False),
        ({"name": "iperf3", "state": "absent"}, False),
        ({"update_cache": True}, False),
    ],
)
def test_the_rule_sees_an_install_that_leans_on_old_lists(args: dict, refused: bool) -> None:
    task = {"hosts": "all", "tasks": [{"block": [{"name": "x", "ansible.builtin.apt": args}]}]}
    assert any(installs_without_refresh(found) for found in tasks_in([task])) is refused
