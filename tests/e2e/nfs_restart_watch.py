"""Runs on the lab's NFS server (python3 of the VM, no project imports): stops nfs-server for OUTAGE_S as soon
as the job's first new checkpoint at or past a step is on the export, starts it again, and writes what happened
as JSON.

Watching on the server itself, from checkpoints (rank 0 fsyncs them before the rename), injects the fault
at a known point wherever rank 0 runs. Polling metrics.jsonl over SSH from the controller did not: rank 0 on
the NFS client keeps that file open, so the server saw its lines only at write-back, up to 30 s late, and
the whole job could end between two polls.

    python3 nfs_restart_watch.py CHECKPOINT_DIR STEP RESULT_JSON TIMEOUT_S
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

CHECKPOINT = re.compile(r"ckpt-(\d{8})\.pt")
# Down this long, then the grace period: longer than the client's heartbeat period (5 s), so the job's own I/O
# on the client is sure to meet the outage; far shorter than what is left of the job after the checkpoint.
OUTAGE_S = 10


def new_checkpoints(directory: Path, known_inodes: set[int]) -> dict[int, int]:
    """step -> inode of the checkpoints written since arming (a rename into place makes a new inode)."""
    found = {}
    for entry in os.scandir(directory) if directory.is_dir() else ():
        match = CHECKPOINT.fullmatch(entry.name)
        if match and entry.inode() not in known_inodes:
            found[int(match.group(1))] = entry.inode()
    return found


def main(directory: Path, step: int, result: Path, timeout_s: float) -> None:
    known = set(new_checkpoints(directory, set()).values())
    deadline = time.monotonic() + timeout_s
    outcome: dict[str, object] = {"error": f"no new checkpoint of step >= {step} within {timeout_s:.0f} s"}
    while time.monotonic() < deadline:
        seen = new_checkpoints(directory, known)
        if seen and max(seen) >= step:
            restart = subprocess.run(
                f"systemctl stop nfs-server && sleep {OUTAGE_S} && systemctl start nfs-server"
                " && systemctl is-active nfs-server",
                shell=True,
                capture_output=True,
                text=True,
                check=False,
            )
            outcome = {
                "checkpoint_step_at_restart": max(seen),
                "outage_s": OUTAGE_S,
                "restart_rc": restart.returncode,
                "restart_output": restart.stdout + restart.stderr,
                # Once the server answers again: had the job already written its last checkpoint?
                "newest_checkpoint_step_after_restart": max(new_checkpoints(directory, known)),
            }
            break
        time.sleep(0.5)
    partial = result.with_suffix(".tmp")
    partial.write_text(json.dumps(outcome))
    partial.replace(result)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
