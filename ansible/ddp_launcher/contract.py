"""The data the launcher, the callback, the control commands and the report agree on, defined once.

The node runner (ansible/roles/train/files/ddp_node.py) prints one JSON object per call, whose "kind" says what
it is; readers find a report by that kind in any task's result, so no task title carries meaning. run.json, the
record of one run, carries RUN_RECORD_VERSION; a reader that meets a newer version says so instead of guessing.
"""

from __future__ import annotations

import json
from typing import Any

# What ddp_node.py prints: its `poll` (job state, heartbeats, the master's newest metrics) and its `logs`.
POLL_REPORT = "ddp_node.poll/1"
LOG_REPORT = "ddp_node.log/1"
# ... and its `busy`: whether a run holds the cluster's lock, and which.
BUSY_REPORT = "ddp_node.busy/1"
# What files/ddp_env.py place prints: whether the job's environment was there already, or was put in place.
ENV_REPORT = "ddp_env.place/1"
# ... and its list: the environments on shared storage, and those a prune removed.
ENV_LIST_REPORT = "ddp_env.list/1"
# What files/ddp_data.py stage prints on each node: how much of the dataset its local copy needed.
STAGE_REPORT = "ddp_data.stage/1"
# run.json's "version": raised when a field changes meaning or goes away (new fields keep it).
RUN_RECORD_VERSION = 1


def parse_report(stdout: object, kind: str) -> dict[str, Any] | None:
    """The node runner's report of that kind printed on stdout, or None for any other output. The report may
    follow other output: a login banner, or a blank line that a become method's terminal left."""
    start = stdout.find('{"kind": ') if isinstance(stdout, str) else -1
    if start < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(stdout, start)
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) and report.get("kind") == kind else None


def task_report(event: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The node runner's report of that kind in an ansible-runner task event (a retry's too), or None."""
    if event.get("event") not in ("runner_on_ok", "runner_retry", "runner_on_failed"):
        return None
    return parse_report((event.get("event_data", {}).get("res") or {}).get("stdout"), kind)


def attempt_of(record: dict[str, Any]) -> str:
    """Which attempt of how many a run is ("2/3"), where the run may be retried (train_retries); "-" otherwise."""
    retries = int(record.get("settings", {}).get("retries") or 0)
    return f"{record.get('attempt', 1)}/{retries + 1}" if retries else "-"
