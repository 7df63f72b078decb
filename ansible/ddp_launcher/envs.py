"""`make envs` and `make envs-prune`: the job environments on the cluster's shared storage.

    ddp envs [--inventory inventory/local] [--artifacts DIR] [--prune-days N] [--extra-vars VARS ...]

One line per environment (<shared_dir>/ddp/envs/<key>, read on the training group's master as the job's user):
its key, size, when a launch last used it, how many of the runs in the artifacts directory used it, and what it
adds to the runtime. With --prune-days N, the environments no launch used for N days are removed first, except
those of runs still running; a later run that needs one makes it again.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import control
from .contract import ENV_LIST_REPORT, task_report

ENVS_PLAYBOOK = control.ROOT / "ansible" / "playbooks" / "envs.yml"


def keys_in_use(artifacts: Path) -> tuple[Counter[str], list[str]]:
    """How many runs used each environment key, and the keys of runs still running (never pruned)."""
    used: Counter[str] = Counter()
    running = []
    for run in control.all_runs(artifacts):
        key = (run.record.get("env") or {}).get("key")
        if key:
            used[key] += 1
            if run.status == "running":
                running.append(key)
    return used, running


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"


def table(report: dict[str, Any], used: Counter[str], now: float) -> list[str]:
    lines = [f"{'KEY':<26} {'SIZE':>9} {'LAST USED':>12} {'RUNS':>5}  PACKAGES"]
    for env in report["envs"]:
        packages = ", ".join(env["packages"]) if env["packages"] is not None else "(not recorded)"
        lines.append(
            f"{env['key']:<26} {env['bytes'] / 1e6:>6.1f} MB {age(now - env['last_used']):>12} "
            f"{used[env['key']]:>5}  {packages or 'nothing beyond the runtime'}"
        )
    return lines


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inventory", default="inventory/local")
    parser.add_argument("--artifacts", type=Path, default=control.ARTIFACTS)
    parser.add_argument("--prune-days", type=float, help="remove the environments unused for this many days")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS")
    args = parser.parse_args(argv)
    used, running = keys_in_use(args.artifacts.resolve())
    extravars: dict[str, Any] = {"__train_envs_keep": running}
    if args.prune_days is not None:
        extravars["__train_envs_prune_days"] = args.prune_days
    reports: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        if report := task_report(event, ENV_LIST_REPORT):
            reports.append(report)

    runner = control.run_playbook(
        ENVS_PLAYBOOK,
        str((control.ROOT / args.inventory).resolve()),
        extravars,
        on_event,
        cmdline=control.extra_vars_cmdline(args.extra_vars) or None,
    )
    if runner.rc != 0 or not reports:
        print(f"make envs: the master could not list the environments:\n{runner.output[-2000:]}", file=sys.stderr)
        return 2
    report = reports[0]
    if args.prune_days is not None:
        removed = ", ".join(report["removed"]) or "none"
        print(f"removed the environments unused for {args.prune_days:g} days: {removed}")
    if not report["envs"]:
        print("no job environments on shared storage")
        return 0
    print("\n".join(table(report, used, time.time())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
