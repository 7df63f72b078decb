"""Action ddp_run_artifacts: run.json and the run's files on the controller, in the play's own process.

    ddp_run_artifacts: {run_dir: D, launcher_path: P, record: FIELDS, code: CODE}   run.json (and code.json)
    ddp_run_artifacts: {run_dir: D, launcher_path: P, outcome: OUTCOME}             the run's end (finish)

The launcher package's ddp_launcher.artifacts does the work; this plugin calls it where the play runs, instead of
a command module that would start two Python processes on the controller for each record (half a second each).
launcher_path is where the package lives (ansible/), for a play run by ansible-playbook without it installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False  # the controller's own files: no connection to any node

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        unknown = set(args) - {"run_dir", "launcher_path", "record", "code", "outcome"}
        if unknown or "run_dir" not in args or ("record" in args) == ("outcome" in args):
            raise AnsibleActionFail(
                f"ddp_run_artifacts takes run_dir and either record (with code) or outcome; got {sorted(args)}"
            )
        launcher_path = str(args.get("launcher_path") or "")
        if launcher_path and launcher_path not in sys.path:
            sys.path.insert(0, launcher_path)
        from ddp_launcher import artifacts

        run_dir = Path(str(args["run_dir"]))
        if "record" in args:
            artifacts.record(run_dir, dict(args["record"]), code=args.get("code"))
            return result | {"changed": True}
        lines = artifacts.finish(run_dir, dict(args["outcome"]))
        return result | {"changed": True, "summary": lines}
