#!/usr/bin/env python3
"""The node's side of a job's Python environment, run as the job's user on the master (tasks/job_env.yml).

    ddp_env.py base RUNTIME_JSON   what the runtime's own environment holds: {"kind": "ddp_env.base/1", "python",
                                   "machine", "glibc", "dists": {name: version}}; RUNTIME_JSON is {"python": path}
                                   (host) or {"image": name} (docker: read inside the image)
    ddp_env.py place SPEC_JSON     under ENVS/KEY.lock: finds ENVS/KEY (found), or moves INCOMING, the environment
                                   the controller made and this run unpacked, to ENVS/KEY (placed); prints
                                   {"kind": "ddp_env.place/1", "key", "found", "placed", "packages"}; a run that
                                   finds or places it marks it used (its mtime), for `ddp envs`

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
from pathlib import Path

BASE_REPORT = "ddp_env.base/1"
PLACE_REPORT = "ddp_env.place/1"
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("base", "place"):
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(args[1])
    print(json.dumps(base(spec) if args[0] == "base" else place(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
