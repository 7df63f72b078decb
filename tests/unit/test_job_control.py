"""A run under control on inventory/local: Ctrl-C cleans up, a detached run is watched, followed and stopped from
another command, and bad input is refused with the words that say why."""

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from _make import ARTIFACTS, ROOT, finished_report, make, make_train, node_log, processes_of, run_record

pytestmark = pytest.mark.slow

LONG_RUN = "EXTRA_VARS=train_steps=100000"


def test_ctrl_c_stops_the_run_everywhere_collects_it_and_marks_it_cancelled():
    train = subprocess.Popen(
        ["make", "--no-print-directory", "train", LONG_RUN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    output = []
    for line in train.stdout:  # until the job takes steps
        output.append(line)
        if "  [localhost] step " in line:
            break
    interrupted_at = time.monotonic()
    os.killpg(train.pid, signal.SIGINT)  # what Ctrl-C does
    rest, _ = train.communicate(timeout=90)
    output = "".join(output) + rest
    # make dies of the SIGINT once its recipe did, as an interrupted command should (a shell shows 130).
    assert train.returncode == -signal.SIGINT, output[-3000:]
    assert time.monotonic() - interrupted_at < 60, output[-3000:]

    run_id = output.split("interrupted: stopping run ")[1].split()[0]
    # The launcher chose the id's unique part: the time and four random hex digits, so that two launches of one
    # job in the same second stay apart.
    assert re.fullmatch(r"local-smoke-\d{8}-\d{6}-[0-9a-f]{4}", run_id), run_id
    assert run_record(run_id)["status"] == "cancelled"
    assert f"{run_id:<36} local-smoke      cancelled" in make("runs").stdout
    assert "stopped run" in output and "everywhere in" in output
    assert (ARTIFACTS / run_id / "logs" / "localhost" / "node.log").is_file()
    assert "<h2>Plots</h2><figure>" in finished_report(ARTIFACTS / run_id)
    manifest = ["sha256sum", "-c", "MANIFEST.sha256"]
    check = subprocess.run(manifest, cwd=ARTIFACTS / run_id, capture_output=True, check=False)
    assert check.returncode == 0, check.stdout
    assert processes_of(run_id) == ""


def test_detached_run_status_logs_stop_and_runs():
    started, run_id = make_train("DETACH=1", LONG_RUN)
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"make stop RUN={run_id}" in started.stdout
    assert run_record(run_id)["status"] == "running"

    deadline = time.monotonic() + 60
    while "step " not in (status := make("status", f"RUN={run_id}")).stdout:
        assert time.monotonic() < deadline, status.stdout + status.stderr
    assert "job: running" in status.stdout
    assert "[localhost] running, heartbeat" in status.stdout

    logs = make("logs", f"RUN={run_id}", "NODE=localhost")
    assert "[localhost] step " in logs.stdout, logs.stdout[-2000:] + logs.stderr

    stopped = make("stop", f"RUN={run_id}")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"run {run_id}: cancelled" in stopped.stdout
    assert processes_of(run_id) == ""
    assert run_record(run_id)["status"] == "cancelled"
    # An ended run is read from its record: not collected again (a newer run's files would land in its folder),
    # its end not rewritten, nothing signalled.
    ended = run_record(run_id)["ended"]
    manifest = (ARTIFACTS / run_id / "MANIFEST.sha256").stat().st_mtime_ns
    again = make("status", f"RUN={run_id}")
    assert "job: cancelled" in again.stdout and f"run {run_id}: cancelled" in again.stdout, again.stdout
    assert "already ended (cancelled" in make("stop", f"RUN={run_id}").stdout
    assert run_record(run_id)["ended"] == ended
    assert (ARTIFACTS / run_id / "MANIFEST.sha256").stat().st_mtime_ns == manifest
    # Following the log of a run that ended prints all of it, up to the stop, and returns.
    followed = make("logs", f"RUN={run_id}", "FOLLOW=1", timeout=60)
    assert "[localhost] step " in followed.stdout
    assert "[localhost] [rank 0] stopping: received SIGTERM; process group destroyed" in followed.stdout
    said = "[localhost] ddp_node: stopped: SIGTERM, and the job left within its 15 s grace period"
    assert followed.stdout.rstrip().endswith(said), followed.stdout[-1000:]


def test_a_bad_config_key_is_refused_in_preflight_naming_it():
    args = '{"train_program_args": ["--config", "%s", "--set", "optim.lerning_rate=0.1"]}'
    done, _ = make_train(f"EXTRA_VARS={args % (ROOT / 'train/configs/cpu-smoke.yaml')}")
    assert done.returncode != 0
    assert "config error: unknown key 'optim.lerning_rate'" in done.stderr, done.stdout + done.stderr
    assert "starting torchrun" not in done.stdout


def test_a_rank_failure_shows_the_ranks_first_error_line():
    done, run_id = make_train(f"PROGRAM={ROOT}/examples/ddp-tutorial/main.py", "ARGS=x 1", "JOB=unit-rank-failure")
    assert done.returncode != 0
    first_error = "First error in localhost's log: main.py: error: argument total_epochs: invalid int value: 'x'"
    assert first_error in done.stderr, done.stderr[-3000:]
    assert run_record(run_id)["status"] == "failed"
    assert "invalid int value" in node_log(run_id)


def test_a_reused_run_id_is_refused():
    existing = f"unit-reused-{uuid.uuid4().hex[:8]}"
    (ARTIFACTS / existing).mkdir(parents=True)
    (ARTIFACTS / existing / "run.json").write_text('{"status": "failed"}\n')
    done, _ = make_train(f"EXTRA_VARS=train_run_id={existing}")
    assert done.returncode != 0
    assert f"train_run_id={existing}" in done.stderr and "already holds a run" in done.stderr


def test_a_checkpoint_directory_the_job_cannot_write_is_refused_before_launch(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    checkpoints.chmod(0o755)
    # Immutable: not even root can create a file in it, as on a read-only export.
    subprocess.run(["chattr", "+i", str(checkpoints)], check=True)
    try:
        done, _ = make_train(f"EXTRA_VARS=train_checkpoint_dir={checkpoints}")
    finally:
        subprocess.run(["chattr", "-i", str(checkpoints)], check=True)
    assert done.returncode != 0
    assert f"host localhost cannot write to {checkpoints} as user root" in done.stderr, done.stdout + done.stderr
    assert "starting torchrun" not in done.stdout
    assert list(checkpoints.iterdir()) == []


def test_shared_storage_that_stops_answering_fails_the_launch_and_stops_the_run():
    run_id = f"unit-hung-poll-{uuid.uuid4().hex[:8]}"
    poll = f"ddp_node.py .*poll --node-dir \\S*/{run_id} "
    done_event = threading.Event()
    frozen: set[str] = set()

    def freeze_every_poll() -> None:
        # A stopped poller never returns, as a read of a hard NFS mount whose server is gone never does.
        while not done_event.wait(0.05):
            found = subprocess.run(["pgrep", "-f", poll], capture_output=True, text=True, check=False)
            for pid in set(found.stdout.split()) - frozen:
                subprocess.run(["kill", "-STOP", pid], check=False)
                frozen.add(pid)

    freezer = threading.Thread(target=freeze_every_poll, daemon=True)
    freezer.start()
    settings = {"train_steps": 100000, "train_run_id": run_id, "train_poll_timeout_s": 5}
    try:
        done, _ = make_train(f"EXTRA_VARS={json.dumps(settings)}")
    finally:
        done_event.set()
        freezer.join()
        for pid in frozen:
            subprocess.run(["kill", "-KILL", pid], check=False)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert frozen, output[-3000:]
    assert "did not answer a poll within 5 s (train_poll_timeout_s) on host localhost" in output, output[-3000:]
    assert processes_of(run_id) == ""
    record = run_record(run_id)
    assert record["status"] == "failed" and record["failed_node"] == "localhost"
