"""train_retries on inventory/local: a run that fails is launched again as an attempt of its own, which resumes
from the job's checkpoint; every attempt is in run.json, `make runs` and report.html. A config error is not
retried."""

import json
import subprocess
import time
import uuid

import pytest
from _make import ARTIFACTS, ROOT, make, make_train, node_log, processes_of, run_record
from _modules import load

pytestmark = pytest.mark.slow

FLAKY = load("jobs", ROOT / "molecule" / "shared" / "jobs.py").FLAKY


def launch(tmp_path, exit_code: int, retries: int, *more: str, program_text: str = FLAKY):
    program = tmp_path / "code" / "flaky.py"
    program.parent.mkdir()
    program.write_text(program_text)
    return make_train(
        f"PROGRAM={program}",
        f"ARGS={exit_code}",
        f"JOB=unit-retry-{uuid.uuid4().hex[:8]}",
        f"EXTRA_VARS={json.dumps({'train_retries': retries})}",
        *more,
    )


def test_a_failed_run_is_retried_from_its_checkpoint_and_every_attempt_is_recorded(tmp_path):
    done, second = launch(tmp_path, exit_code=3, retries=2)  # the summary names the last attempt
    assert done.returncode == 0, done.stdout + done.stderr
    assert "  attempt 1 of 3 failed on localhost: exit code 3; retrying as attempt 2" in done.stdout, done.stdout
    assert second.endswith("-try2"), second
    first = second.removesuffix("-try2")
    assert "resumed from ckpt-000005.pt" in node_log(second)
    assert "training finished" in done.stdout and f"run {second}" in done.stdout
    attempts = [
        {"run_id": first, "status": "failed", "failed_node": "localhost", "reason": "exit code 3", "exit_code": 3},
        {"run_id": second, "status": "succeeded", "failed_node": None, "reason": None, "exit_code": None},
    ]
    for run_id, attempt in ((first, 1), (second, 2)):
        record = run_record(run_id)
        assert (record["attempt"], record["attempts"]) == (attempt, attempts)
    listed = make("runs").stdout
    assert any(line.startswith(first) and " failed     1/3 " in line for line in listed.splitlines()), listed
    assert any(line.startswith(second) and " succeeded  2/3 " in line for line in listed.splitlines()), listed
    report = (ARTIFACTS / second / "report.html").read_text()
    assert f"<th>1. {first}</th><td>failed on localhost: exit code 3</td>" in report
    assert f"<th>2. {second}</th><td>succeeded</td>" in report


def test_a_usage_error_is_not_retried(tmp_path):
    done, first = launch(tmp_path, exit_code=2, retries=2)
    assert done.returncode != 0
    assert "retrying" not in done.stdout and "training FAILED" in done.stdout
    assert run_record(first)["exit_code"] == 2 and "attempts" not in run_record(first)


def test_a_detached_run_is_watched_from_this_machine_and_retried_from_its_checkpoint(tmp_path):
    # Long enough to be running when the detached launch returns, then failing once.
    done, first = launch(tmp_path, 3, 1, "DETACH=1", program_text="import time\ntime.sleep(8)\n" + FLAKY)
    assert done.returncode == 0, done.stdout + done.stderr
    watch_log = ARTIFACTS / first / "watch.log"
    assert f"run {first} is running on every node, detached.\n" in done.stdout, done.stdout
    assert f"  a watcher on this machine retries it (train_retries: 1) while this machine is up: {watch_log}\n" in (
        done.stdout
    )
    second = f"{first}-try2"
    deadline = time.monotonic() + 300
    while processes_of(first) and time.monotonic() < deadline:  # the watcher names the run it watches
        time.sleep(2)
    watched = watch_log.read_text()
    assert not processes_of(first), watched
    assert "  attempt 1 of 2 failed on localhost: exit code 3; retrying as attempt 2" in watched, watched
    assert run_record(second)["status"] == "succeeded" and "training finished" in watched, watched
    assert "resumed from ckpt-000005.pt" in node_log(second)
    assert [attempt["status"] for attempt in run_record(first)["attempts"]] == ["failed", "succeeded"]
    assert run_record(second)["attempt"] == 2
    # The watcher's log, still written after the first run was collected, is a record, not a result.
    for run_id in (first, second):
        verified = subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=ARTIFACTS / run_id, check=False)
        assert verified.returncode == 0, run_id
