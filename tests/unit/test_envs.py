"""`make envs` and `make envs-prune` on inventory/local: the environments on shared storage with their size, last
use, runs and packages; a prune removes the old ones but never one a running run uses."""

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest
from _make import ROOT, make

pytestmark = pytest.mark.slow

ENVS = ROOT / "runs" / "ddp" / "envs"


@pytest.fixture
def envs():
    """Two environments as the launch places them: one used now, one last used 40 days ago."""
    keys = {"fresh": f"unit{uuid.uuid4().hex[:20]}", "old": f"unit{uuid.uuid4().hex[:20]}"}
    for name, key in keys.items():
        site = ENVS / key / "site-packages"
        site.mkdir(parents=True)
        (site / "demo.py").write_bytes(b"x" * 250_000)
        (ENVS / key / "packages.json").write_text(json.dumps([f"demo-{name}==1.0"]))
    long_ago = time.time() - 40 * 86400
    os.utime(ENVS / keys["old"], (long_ago, long_ago))
    yield keys
    for key in keys.values():
        for leftover in (ENVS / key, ENVS / f".removing-{key}", ENVS / f"{key}.lock"):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            elif leftover.exists():
                leftover.unlink()


def line_of(output: str, key: str) -> str:
    return next((line for line in output.splitlines() if line.startswith(key)), "")


def test_envs_lists_each_environment_and_a_prune_removes_only_the_old_ones(envs, tmp_path):
    listed = make("envs")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    fresh, old = line_of(listed.stdout, envs["fresh"]), line_of(listed.stdout, envs["old"])
    assert fresh.split()[1:5] == ["0.3", "MB", "just", "now"] and fresh.endswith("demo-fresh==1.0"), listed.stdout
    assert old.split()[1:5] == ["0.3", "MB", "40", "d"] and old.endswith("demo-old==1.0"), listed.stdout

    # A run still running that uses the old one keeps it.
    running = tmp_path / "artifacts" / "keeper-20261206-000000-beef"
    running.mkdir(parents=True)
    (running / "run.json").write_text(json.dumps({"status": "running", "env": {"key": envs["old"]}}))
    kept = make_envs("--artifacts", str(tmp_path / "artifacts"), "--prune-days", "30")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert kept.stdout.startswith("removed the environments unused for 30 days: ")
    assert envs["old"] not in kept.stdout.splitlines()[0] and (ENVS / envs["old"]).is_dir()
    assert line_of(kept.stdout, envs["old"]).split()[6] == "1", kept.stdout  # RUNS: the running one

    pruned = make("envs-prune", "DAYS=30")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    removed = line_of(pruned.stdout, "removed the environments unused for 30 days: ")
    assert envs["old"] in removed and envs["fresh"] not in removed, pruned.stdout
    assert not (ENVS / envs["old"]).exists() and (ENVS / envs["fresh"]).is_dir()
    assert line_of(pruned.stdout, envs["fresh"]) and not line_of(pruned.stdout, envs["old"])


def make_envs(*args: str) -> subprocess.CompletedProcess:
    """`ddp envs` itself, for the options make does not pass (another artifacts directory)."""
    command = [str(ROOT / ".venv" / "bin" / "ddp"), "envs", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
