"""Drives the lab (tests/lab/lab.sh: two Debian 12 QEMU VMs with the distribution kernel) from the e2e tests:
site.yml, `make train`, commands on the VMs, and what a run collected."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LAB_SH = ROOT / "tests" / "lab" / "lab.sh"
VMCTL = ROOT / "molecule" / "vm" / "vmctl.sh"
# The lab's inventory (checked in) and the part of it `lab.sh up` writes: each VM's SSH port forward.
INVENTORY = ROOT / "inventory" / "vm-lab"
PORTS = ROOT / ".cache" / "lab" / "host_vars"
ARTIFACTS = ROOT / "artifacts"
LAB_SET = "lab"
NODES = ("lab-node0", "lab-node1")
SERVER, CLIENT = NODES
# train_job_name in the lab's inventory (group_vars/all/zz-vm-lab.yml): checkpoints in /data/ddp/<job>/checkpoints.
JOB = "lab"
# The e2e run: this many steps, with the NFS server stopped for a while once the step-10 checkpoint is on it (the
# lab saves every 10 steps). Rank 0 trains on through the outage (its checkpoints are on the server's own disk),
# so the job must be long enough that it is still running when the server is back: measured, a step takes ~0.4 s
# and stop, 10 s down and start ~16 s, so the server was back at step 40.
STEPS = 60
RESTART_AT_CHECKPOINT = 10
CHECKPOINTS = f"/data/ddp/{JOB}/checkpoints"
# cluster_user in the lab's inventory (group_vars/all/cluster.yml): the account the jobs run as, which owns them.
CLUSTER_USER = "ddp"
# On the server's own disk, not on the share.
WATCHER = "/root/nfs_restart_watch.py"
WATCHER_RESULT = "/root/nfs-restart.json"
WATCHER_UNIT = "ddp-e2e-nfs-restart"
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
    """site.yml on the lab; its output (with every task's time) is kept as artifacts/lab-site-<n>.log, where CI
    time is looked for."""
    result = lab("site", timeout=timeout)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = len(list(ARTIFACTS.glob("lab-site-*.log"))) + 1
    (ARTIFACTS / f"lab-site-{kept}.log").write_text(result.output)
    return result


def recap(output: str) -> dict[str, dict[str, int]]:
    """Per host: changed, unreachable, failed, from the last PLAY RECAP."""
    last = output[output.rindex("PLAY RECAP") :]
    return {
        host: {"changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
        for host, changed, unreachable, failed in RECAP_LINE.findall(last)
    }


def on(node: str, command: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A shell command on one lab VM, as root."""
    return subprocess.run(
        [str(VMCTL), "ssh", LAB_SET, node, command],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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
    """`make train` against the lab inventory (through lab.sh, as `make lab` does); the run it collected, by the
    directory it names (not the newest one in artifacts/, which another run on this machine may have made)."""
    result = lab("train", *make_args, timeout=timeout)
    named = re.search(r"^  full Ansible output: (.+)/ansible\.log$", result.output, re.MULTILINE)
    return Training(result, Path(named.group(1)) if named else None)


def arm_nfs_restart(timeout_s: float = 1500) -> None:
    """Starts tests/e2e/nfs_restart_watch.py on the NFS server, detached: it stops nfs-server for a while as soon
    as this job's first new checkpoint of step RESTART_AT_CHECKPOINT or later is on the export."""
    on(SERVER, f"systemctl stop {WATCHER_UNIT} 2>/dev/null; rm -f {WATCHER_RESULT}")
    script = (Path(__file__).parent / "nfs_restart_watch.py").read_text()
    copied = on(SERVER, f"cat > {WATCHER}", stdin=script)
    assert copied.returncode == 0, copied.stderr
    args = f"{WATCHER} {CHECKPOINTS} {RESTART_AT_CHECKPOINT} {WATCHER_RESULT} {timeout_s:.0f}"
    armed = on(SERVER, f"systemd-run --quiet --collect --unit={WATCHER_UNIT} python3 {args}")
    assert armed.returncode == 0, armed.stdout + armed.stderr


def nfs_restart_outcome() -> dict[str, Any]:
    """What the watcher did; stops it first, so that it cannot fire later."""
    on(SERVER, f"systemctl stop {WATCHER_UNIT} 2>/dev/null")
    result = on(SERVER, f"cat {WATCHER_RESULT}")
    if result.returncode != 0:
        return {"error": "the watcher never fired (no new checkpoint reached the server)"}
    return json.loads(result.stdout)
