"""train_retries on inventory/local: a run that fails is launched again as an attempt of its own, which resumes
from the job's checkpoint; every attempt is in run.json, `make runs` and report.html. A config error is not
retried."""

import json
import uuid

import pytest
from _make import ARTIFACTS, ROOT, make, make_train, node_log, run_record
from _modules import load

pytestmark = pytest.mark.slow

FLAKY = load("jobs", ROOT / "molecule" / "shared" / "jobs.py").FLAKY


def launch(tmp_path, exit_code: int, retries: int):
    program = tmp_path / "code" / "flaky.py"
    program.parent.mkdir()
    program.write_text(FLAKY)
    return make_train(
        f"PROGRAM={program}",
        f"ARGS={exit_code}",
        f"JOB=unit-retry-{uuid.uuid4().hex[:8]}",
        f"EXTRA_VARS={json.dumps({'train_retries': retries})}",
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
