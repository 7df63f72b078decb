#!/usr/bin/env python3
"""The node's side of a job's Python environment, run as the job's user on the master (tasks/job_env.yml).

    ddp_env.py base RUNTIME_JSON   what the runtime's own environment holds: {"kind": "ddp_env.base/1", "python",
                                   "machine", "glibc", "dists": {name: version}}; RUNTIME_JSON is {"python": path}
                                   (host) or {"image": name} (docker: read inside the image)
    ddp_env.py place SPEC_JSON     under ENVS/KEY.lock: finds ENVS/KEY (found), or moves INCOMING, the environment
                                   the controller made and this run unpacked, to ENVS/KEY (placed); prints
                                   {"kind": "ddp_env.place/1", "key", "found", "placed", "packages"}; a run that
                                   finds or places it marks it used (its mtime), for `ddp envs`

    ddp_env.py receive SPEC_JSON   makes INCOMING (0700) for the environment the controller made, once ENVS has
                                   room for its "bytes" (and a tenth more); otherwise exits 1 saying how much
                                   each side has, before anything is written
    ddp_env.py list SPEC_JSON      the environments in ENVS: {"kind": "ddp_env.list/1", "envs": [{"key", "bytes",
                                   "last_used", "packages"}], "removed": [...]}; with "prune_days" in SPEC_JSON,
                                   removes those unused for that many days first, each under its lock, except the
                                   keys in "keep" (environments of runs still running)

SPEC_JSON: {"envs", "key", "incoming"} (incoming may be absent: then only look). An environment is never used
half-made: only a complete one is renamed into place, and a concurrent run of the same key, which waits on the
lock, finds it there and drops its own copy. Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BASE_REPORT = "ddp_env.base/1"
PLACE_REPORT = "ddp_env.place/1"
LIST_REPORT = "ddp_env.list/1"
RECEIVE_REPORT = "ddp_env.receive/1"
PACKAGES_FILE = "packages.json"  # written by library/ddp_job_env.py beside site-packages
# Run by the runtime's own python: the environment the job would run in, not this script's.
BASE_PROBE = """
import importlib.metadata as m, json, platform
dists = {d.metadata["Name"]: d.version for d in m.distributions() if d.metadata["Name"]}
print(json.dumps({"python": platform.python_version(), "machine": platform.machine(),
                  "glibc": platform.libc_ver()[1], "dists": dists}))
"""


def base(runtime: dict[str, str]) -> dict[str, object]:
    if "image" in runtime:
        argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", runtime["image"]]
    else:
        argv = [runtime["python"]]
    done = subprocess.run([*argv, "-c", BASE_PROBE], capture_output=True, text=True, check=True)
    return {"kind": BASE_REPORT, **json.loads(done.stdout)}


def place(spec: dict[str, str]) -> dict[str, object]:
    envs, key = Path(spec["envs"]), spec["key"]
    report: dict[str, object] = {"kind": PLACE_REPORT, "key": key, "found": False, "placed": False}
    envs.mkdir(mode=0o700, parents=True, exist_ok=True)
    incoming = Path(spec["incoming"]) if spec.get("incoming") else None
    with (envs / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run of the same key places its copy first
        if (envs / key).is_dir():
            if incoming is not None:
                shutil.rmtree(incoming, ignore_errors=True)
            return report | {"found": True, "packages": used(envs / key)}
        if incoming is None:
            return report  # the controller makes the environment, this run unpacks it, then asks again
        incoming.rename(envs / key)
        return report | {"placed": True, "packages": used(envs / key)}


def used(env: Path) -> list[str] | None:
    """What the environment adds (None for one placed before it said), marking it used now."""
    os.utime(env)
    listed = env / PACKAGES_FILE
    return json.loads(listed.read_text()) if listed.is_file() else None


class NoRoom(OSError):
    """Shared storage has not the room an environment needs."""


def receive(spec: dict[str, Any]) -> dict[str, object]:
    envs, incoming, needed = Path(spec["envs"]), Path(spec["incoming"]), int(spec["bytes"])
    envs.mkdir(mode=0o700, parents=True, exist_ok=True)
    free = shutil.disk_usage(envs).free
    if free < needed * 1.1:
        raise NoRoom(
            f"shared storage at {envs} has {free / 1e6:.0f} MB free; the job's environment needs {needed / 1e6:.0f} "
            "MB (and a tenth more): free some (make envs-prune DAYS=N removes old environments) or trim the "
            "requirements"
        )
    incoming.mkdir(mode=0o700)
    return {"kind": RECEIVE_REPORT, "free": free, "bytes": needed}


def listing(spec: dict[str, Any]) -> dict[str, object]:
    envs = Path(spec["envs"])
    keys = sorted(p.name for p in envs.iterdir() if p.is_dir() and not p.name.startswith(".")) if envs.is_dir() else []
    removed = []
    if spec.get("prune_days") is not None:
        cutoff = time.time() - float(spec["prune_days"]) * 86400
        for key in keys:
            if key not in spec.get("keep", []) and prune(envs, key, cutoff):
                removed.append(key)
    found = []
    for key in keys:
        env = envs / key
        if key in removed or not env.is_dir():
            continue
        listed = env / PACKAGES_FILE
        found.append(
            {
                "key": key,
                "bytes": sum(f.stat().st_size for f in env.rglob("*") if f.is_file() and not f.is_symlink()),
                "last_used": env.stat().st_mtime,
                "packages": json.loads(listed.read_text()) if listed.is_file() else None,
            }
        )
    return {"kind": LIST_REPORT, "envs": found, "removed": removed}


def prune(envs: Path, key: str, cutoff: float) -> bool:
    """Removes ENVS/KEY if it was last used before cutoff, under the key's lock: a launch that finds it in that
    moment either finds it whole (and marks it used, which keeps it) or not at all (and makes it again)."""
    with (envs / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = envs / key
        if not env.is_dir() or env.stat().st_mtime >= cutoff:
            return False
        doomed = envs / f".removing-{key}"
        env.rename(doomed)
    shutil.rmtree(doomed)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    commands = {"base": base, "place": place, "list": listing, "receive": receive}
    if len(args) != 2 or args[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(json.dumps(commands[args[0]](json.loads(args[1]))))
    except NoRoom as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
