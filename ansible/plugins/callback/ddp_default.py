"""Ansible's default screen output, except that a training run's progress polls print progress, not retries."""

from __future__ import annotations

from typing import Any

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# The launcher package (make setup installs it into .venv, where Ansible runs) defines the report kinds once.
from ddp_launcher.contract import POLL_REPORT, parse_report

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
      - the launcher package ddp_launcher importable (make setup installs it), for the report kinds
"""


def poll_report(result: dict[str, Any]) -> dict[str, Any] | None:
    return parse_report(result.get("stdout"), POLL_REPORT)


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
