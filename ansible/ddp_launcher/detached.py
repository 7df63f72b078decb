"""A detached run that may be retried (train_retries) is watched from this machine: a `ddp train` of its own, in
the background, follows the run to its end through the same status calls as `make status`, and retries it as an
attached launch would. Its output goes to the run's watch.log; it ends when the run (or its last attempt) ends."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import control

# How often the watcher asks the nodes how the run goes: each ask is one short status playbook.
ASK_EVERY_S = 10.0  # pragma: no mutate (a pace: slower or faster, the same outcome)


def retries_allowed(run_id: str, artifacts: Path) -> int:
    return int(control.find_run(run_id, artifacts).record.get("settings", {}).get("retries", 0))


def watch_in_background(run_id: str, train_argv: Sequence[str], artifacts: Path) -> Path:
    """Starts the watcher, in a session of its own so that the terminal's Ctrl-C and hang-up do not reach it;
    train_argv: the detached launch's arguments. Returns its log."""
    log = artifacts / run_id / "watch.log"
    command = [sys.executable, "-m", "ddp_launcher", "train"]
    command += [arg for arg in train_argv if arg != "--detach"] + ["--after-detached", run_id]
    with log.open("ab") as output:
        subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    return log


def wait_for_end(run_id: str, artifacts: Path, extra_vars: Sequence[str]) -> control.Run:
    """The run once it ended: judged and collected by the status call (this watcher's or a user's) that first saw
    its end."""
    while True:
        with control.control_lock(control.find_run(run_id, artifacts)) as run:
            if not run.ended:
                control.act(run, "status", lambda _event: None, extra_vars)
        if (run := control.find_run(run_id, artifacts)).ended:
            return run
        time.sleep(ASK_EVERY_S)
