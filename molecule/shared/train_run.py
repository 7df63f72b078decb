"""Runs the launch playbook from a molecule verify step against the scenario's test hosts, and reads what it
collected. Shared by the scenarios that train (on the verifier's PYTHONPATH through molecule/base.yml)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
from testhosts import container

ROOT = Path(os.environ["DDP_REPO_ROOT"])
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
# Where the scenario's inventory tells the train role to collect (train_artifacts_dir).
ARTIFACTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "artifacts"
# The `ddp` command, run by this interpreter (the project's .venv, where make setup installed the launcher).
DDP = [sys.executable, "-m", "ddp_launcher"]
SHARED_DIR = "/data"  # shared_dir of the scenarios that train: a bind mount of one controller directory
TUTORIAL = ROOT / "examples" / "ddp-tutorial"


def run_dirs() -> list[Path]:
    """The collected runs, oldest first (dot directories hold the shipped code's archives, not runs)."""
    if not ARTIFACTS.exists():
        return []
    return sorted(p for p in ARTIFACTS.iterdir() if p.is_dir() and not p.name.startswith("."))


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics" / "summary.json").read_text())


def node_logs(run_dir: Path) -> dict[str, str]:
    """Each node's collected log, by node name."""
    return {log.parent.name: log.read_text() for log in (run_dir / "logs").glob("*/node.log")}


def tutorial_workdir(directory: Path, version: str) -> dict[str, Any]:
    """A copy of the example tutorial script in directory, its sibling module printing `version` on import (a
    code change between runs), and the playbook variables that ship and run it."""
    if not directory.exists():
        shutil.copytree(TUTORIAL, directory)
    model = (TUTORIAL / "model.py").read_text()
    (directory / "model.py").write_text(f'{model}\nprint("code version {version}", flush=True)\n')
    return {"train_workdir": str(directory), "train_program": "main.py"}


def manifest_check(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sha256sum", "-c", "MANIFEST.sha256"], cwd=run_dir, capture_output=True, text=True, check=False
    )


def train(cancel: threading.Event | None = None, **extravars: Any) -> tuple[Any, Path | None]:
    """Runs ansible/playbooks/train.yml against the test hosts; returns the runner and the new run's directory.
    Setting cancel stops the play (the test gave up on it)."""
    before = set(run_dirs())
    private_dir = ARTIFACTS.parent / "runner"
    private_dir.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(private_dir),
        project_dir=str(ROOT),
        playbook=str(ROOT / "ansible/playbooks/train.yml"),
        inventory=str(INVENTORY),
        extravars=extravars,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        },
        quiet=True,
        cancel_callback=cancel.is_set if cancel else None,
    )
    new = sorted(set(run_dirs()) - before)
    return runner, (new[-1] if new else None)


def cli(command_name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The launcher's command (`ddp train`, `ddp status`, `ddp doctor`, ...: what the make targets run) on the test
    hosts."""
    command = [*DDP, command_name, *args]
    if command_name in ("train", "doctor"):
        command += ["--inventory", str(INVENTORY)]
    command += ["--artifacts", str(ARTIFACTS)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def start_cli_training(*args: str) -> subprocess.Popen[str]:
    """`ddp train` in a process group of its own (as a terminal's foreground job), output piped."""
    command = [*DDP, "train", "--inventory", str(INVENTORY)]
    return subprocess.Popen(
        [*command, "--artifacts", str(ARTIFACTS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def play_failure(output: str) -> str:
    """What an assertion should show of a failed play: its fatal results (the train role's names the node and
    tails its log), not the timing recap that ends the output."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    fatal = [block.split("\nPLAY RECAP")[0] for block in plain.split("\nfatal: ")[1:]]
    return "\n".join(f"fatal: {block}" for block in fatal)[-6000:] if fatal else plain[-3000:]


def node_exec(node: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", container(node), *command], capture_output=True, text=True, check=False)


class Background:
    """train(**extravars) on a thread: the test acts on the hosts while the play runs."""

    def __init__(self, **extravars: Any) -> None:
        self.runner: Any = None
        self.run_dir: Path | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, kwargs=extravars, daemon=True)
        self._thread.start()

    def _run(self, **extravars: Any) -> None:
        self.runner, self.run_dir = train(cancel=self._cancel, **extravars)

    def wait(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            # Stop the play rather than leave it running after the test (the hosts go with the scenario).
            self._cancel.set()
            self._thread.join(timeout=60)
            raise AssertionError(f"the play did not end within {timeout:.0f} s")


def wait_for(node: str, *command: str, timeout: float = 300) -> None:
    """Until command succeeds on node (polled twice a second)."""
    deadline = time.monotonic() + timeout
    while node_exec(node, *command).returncode != 0:
        assert time.monotonic() < deadline, f"{' '.join(command)} did not succeed on {node} within {timeout:.0f} s"
        time.sleep(0.5)


@dataclass
class BrokenRun:
    rc: int
    output: str
    seconds_to_fail: float


def break_a_run(node: str, kill: tuple[str, ...], **extravars: Any) -> BrokenRun:
    """Starts a long run, waits until node trains, runs the kill command there, and waits for the play to end."""
    # Marks the start on the shared directory, so that only this run's metrics can count as steps taken.
    started = node_exec(node, "touch", f"{SHARED_DIR}/.break-a-run")
    assert started.returncode == 0, started.stderr
    run = Background(train_resume="never", train_steps=100000, **extravars)
    # Past rendezvous and taking steps: rank 0 has written a metrics line of this run (every node sees the
    # shared directory).
    newer_metrics = f"find {SHARED_DIR} -name metrics.jsonl -newer {SHARED_DIR}/.break-a-run -size +0c | grep -q ."
    wait_for(node, "sh", "-c", newer_metrics)
    node_exec(node, *kill)
    killed_at = time.monotonic()
    run.wait(timeout=240)
    return BrokenRun(run.runner.rc, run.runner.stdout.read(), time.monotonic() - killed_at)
