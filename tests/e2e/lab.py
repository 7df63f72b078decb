"""Drives the lab (tests/lab/lab.sh: two Debian 12 QEMU VMs with the distribution kernel) from the e2e tests:
site.yml, `make train`, commands on the VMs, and what a run collected."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LAB_SH = ROOT / "tests" / "lab" / "lab.sh"
VMCTL = ROOT / "molecule" / "vm" / "vmctl.sh"
INVENTORY = ROOT / ".cache" / "lab" / "inventory"
ARTIFACTS = ROOT / "artifacts"
LAB_SET = "lab"
NODES = ("lab-node0", "lab-node1")
SERVER, CLIENT = NODES
# train_job_name in the lab's inventory (tests/lab/lab.sh): checkpoints in /data/ddp/<job>/checkpoints.
JOB = "lab"
# The e2e run: this many steps, with the NFS server restarted after the step-10 checkpoint.
STEPS = 30
RESTART_AFTER_STEP = 13
RECAP_LINE = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


@dataclass
class Result:
    rc: int
    output: str
    seconds: float


def run(command: list[str], timeout: float) -> Result:
    started = time.monotonic()
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    result = Result(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
    print(f"[e2e] {' '.join(command[:3])}...: exit {result.rc} after {result.seconds:.0f} s", file=sys.stderr)
    return result


def lab(*args: str, timeout: float = 1800) -> Result:
    return run([str(LAB_SH), *args], timeout)


def site(timeout: float = 2400) -> Result:
    return lab("site", timeout=timeout)


def recap(output: str) -> dict[str, dict[str, int]]:
    """Per host: changed, unreachable, failed, from the last PLAY RECAP."""
    last = output[output.rindex("PLAY RECAP") :]
    return {
        host: {"changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
        for host, changed, unreachable, failed in RECAP_LINE.findall(last)
    }


def on(node: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A shell command on one lab VM, as root."""
    return subprocess.run(
        [str(VMCTL), "ssh", LAB_SET, node, command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_dirs() -> set[Path]:
    return {p for p in ARTIFACTS.iterdir() if p.is_dir()} if ARTIFACTS.exists() else set()


@dataclass
class Training:
    result: Result
    run_dir: Path | None

    def metrics(self) -> list[dict[str, Any]]:
        assert self.run_dir, f"no run was collected:\n{self.result.output[-3000:]}"
        lines = (self.run_dir / "metrics" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def summary(self) -> dict[str, Any]:
        assert self.run_dir, f"no run was collected:\n{self.result.output[-3000:]}"
        return json.loads((self.run_dir / "metrics" / "summary.json").read_text())


def train(*make_args: str, timeout: float = 1800) -> Training:
    """`make train` against the lab inventory (through lab.sh, as `make lab` does); the run it collected."""
    before = run_dirs()
    result = lab("train", *make_args, timeout=timeout)
    new = sorted(run_dirs() - before, key=lambda p: p.stat().st_mtime)
    return Training(result, new[-1] if new else None)


class BackgroundTraining:
    """train() on a thread, so that a test can act on the VMs while the job runs."""

    def __init__(self, *make_args: str) -> None:
        self.training: Training | None = None
        self._thread = threading.Thread(target=self._run, args=make_args)
        self._thread.start()

    def _run(self, *make_args: str) -> None:
        self.training = train(*make_args)

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float) -> Training:
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), f"the training run did not end within {timeout:.0f} s"
        assert self.training is not None
        return self.training


def job_runs(job: str) -> set[str]:
    """The run directories a job has on the NFS share (read on the server)."""
    listing = on(SERVER, f"ls /data/ddp/{job}/runs 2>/dev/null")
    return set(listing.stdout.split())


def newest_step(job: str, run: str) -> int:
    """The last step rank 0 logged in one run of a job, read from the NFS share (0 before the first)."""
    probe = on(SERVER, f"tail -1 /data/ddp/{job}/runs/{run}/metrics.jsonl 2>/dev/null")
    try:
        return int(json.loads(probe.stdout)["step"])
    except (ValueError, KeyError):
        return 0


def wait_for_step(job: str, step: int, timeout: float, earlier_runs: set[str], run: BackgroundTraining) -> str:
    """Until the run that is not among earlier_runs logged step; returns that run's name."""
    deadline = time.monotonic() + timeout
    while True:
        assert run.running(), "the run ended before the fault could be injected"
        assert time.monotonic() < deadline, f"{job} did not reach step {step} within {timeout:.0f} s"
        new = sorted(job_runs(job) - earlier_runs)
        if new and newest_step(job, new[-1]) >= step:
            return new[-1]
        time.sleep(3)
