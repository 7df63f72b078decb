"""Ansible's default screen output, except that a training run's progress polls print progress, not retries."""

from __future__ import annotations

import json
from typing import Any

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: ddp_default
    type: stdout
    short_description: default output; a training run's polls show its progress instead of retry noise
    description:
        - The default callback, except for retries of a task whose result is a ddp_node.py poll report (the train
          role's wait for the job, up to one a few seconds for a whole run). Those print the master's step and loss
          when they change, and nothing otherwise.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout_callback in ansible.cfg (this project's does)
"""

# ansible/roles/train/files/ddp_node.py's POLL_REPORT: the kind of JSON its poll prints.
POLL_REPORT = "ddp_node.poll/1"


def poll_report(result: dict[str, Any]) -> dict[str, Any] | None:
    stdout = result.get("stdout")
    if not isinstance(stdout, str) or not stdout.startswith('{"kind": '):
        return None
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return report if report.get("kind") == POLL_REPORT else None


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "ddp_default"

    def __init__(self) -> None:
        super().__init__()
        self._progress: dict[str, str] = {}

    def v2_runner_retry(self, result: Any) -> None:
        report = poll_report(result.result)
        if report is None:
            super().v2_runner_retry(result)
            return
        metrics = report.get("metrics") or {}
        if "step" not in metrics:
            return  # a peer's poll, or no step yet: nothing to say
        line = f"step {metrics['step']}/{metrics.get('target_step', '?')}"
        if isinstance(metrics.get("loss"), int | float):
            line += f", loss {metrics['loss']:.4f}"
        host = result.host.get_name()
        if self._progress.get(host) != line:
            self._progress[host] = line
            if self._last_task_banner != result.task._uuid:  # as the default callback does before a result
                self._print_task_banner(result.task)
            self._display.display(f"  [{host}] {report.get('job')}: {line}")
