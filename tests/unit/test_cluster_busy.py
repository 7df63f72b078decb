"""A second launch on a busy inventory/local: refused before any node changes, naming the running run, its owner,
start and progress; with WAIT=1 it waits, saying so, and runs once the first run is stopped (whose lock file,
left behind, then holds nothing)."""

import getpass
import json
import socket
import subprocess
import time
import uuid
from datetime import datetime

import pytest
from _make import ARTIFACTS, ROOT, make, make_train, run_record

pytestmark = pytest.mark.slow

LONG_RUN = "EXTRA_VARS=train_steps=100000"


@pytest.fixture
def first_run():
    started, run_id = make_train("DETACH=1", LONG_RUN)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_id
    finally:
        make("stop", f"RUN={run_id}")


def wait_for_step(run_id: str) -> None:
    deadline = time.monotonic() + 60
    while "step " not in make("status", f"RUN={run_id}").stdout:
        assert time.monotonic() < deadline, f"run {run_id} took no step"


def test_a_second_launch_is_refused_naming_the_run_then_waits_for_it(first_run, tmp_path):
    wait_for_step(first_run)
    owner = f"{getpass.getuser()}@{socket.gethostname()}"
    started = run_record(first_run)["started"]
    job = f"unit-busy-{uuid.uuid4().hex[:8]}"
    program = tmp_path / "code" / "main.py"
    program.parent.mkdir()
    program.write_text("print('second job ran')\n")

    refused, run_id = make_train(f"PROGRAM={program}", f"JOB={job}")
    assert refused.returncode != 0 and run_id is None, refused.stdout
    said = refused.stdout + refused.stderr
    named = f"the cluster is busy with run {first_run} (job local-smoke) of {owner}, started "
    assert named in said, said
    since = datetime.strptime(said.split(named)[1].split(",")[0], "%Y-%m-%d %H:%M:%S UTC")
    assert abs((since - datetime.fromisoformat(started)).total_seconds()) < 5
    assert (
        ", at step " in said and f"Wait for it with WAIT=1 (train_wait), or stop it: make stop RUN={first_run}" in said
    )
    # Nothing of the second job reached the node: no work dir, no job directories, no run record (only the
    # controller's log of the refused launch).
    assert not (ROOT / "runs" / "ddp" / job).exists()
    assert not list(ARTIFACTS.glob(f"{job}-*/run.json"))

    waiting = subprocess.Popen(
        ["make", "--no-print-directory", "train", f"PROGRAM={program}", f"JOB={job}", "WAIT=1",
         f"EXTRA_VARS={json.dumps({'train_wait_interval_s': 1})}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output = []
    for line in waiting.stdout:
        output.append(line)
        if line.startswith(f"  waiting: the cluster is busy with run {first_run} (job local-smoke) of {owner}"):
            break
    assert make("stop", f"RUN={first_run}").returncode == 0
    rest, _ = waiting.communicate(timeout=240)
    output = "".join(output) + rest
    assert waiting.returncode == 0, output
    second = output.split(f"run {job}-")[1].split(":")[0]
    assert run_record(f"{job}-{second}")["status"] == "succeeded", output
    assert "second job ran" in (ARTIFACTS / f"{job}-{second}" / "logs" / "localhost" / "node.log").read_text()
    # The stopped run's lock file, left behind, held nothing: the second run took it over.
    lock = json.loads((ROOT / "runs" / "ddp" / "cluster.lock").read_text())
    assert lock["job"] == job
