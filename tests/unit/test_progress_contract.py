"""The contract between the nodes' runner (ddp_node.py) and the controller's programs (jobctl.py, run_training.py,
the ddp_default stdout callback): reports are found by their kind, whatever the task that printed them is called."""

import json
import subprocess
import sys
from pathlib import Path

import yaml
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
import jobctl  # noqa: E402  (programs beside the playbooks, not a package)
import run_training  # noqa: E402

RUNNER = ROOT / "ansible/roles/train/files/ddp_node.py"


def test_every_reader_knows_the_kinds_the_runner_prints():
    ddp_node = load("ddp_node", RUNNER)
    assert (jobctl.POLL_REPORT, jobctl.LOG_REPORT) == (ddp_node.POLL_REPORT, ddp_node.LOG_REPORT)
    callback = (ROOT / "ansible/plugins/callback/ddp_default.py").read_text()
    assert f'POLL_REPORT = "{ddp_node.POLL_REPORT}"' in callback


def real_poll_report(tmp_path: Path) -> str:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "status-node0.json").write_text(json.dumps({"beat": 2, "exit_code": None}))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 30, "target_step": 120, "loss": 0.5, "samples_per_s": 900.0}) + "\n")
    args = ["poll", "--node-dir", str(tmp_path / "node"), "--shared-dir", str(shared), "--node", "node0"]
    (tmp_path / "node").mkdir()
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args, "--nodes", "node0", "--metrics", str(metrics)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def test_make_train_prints_progress_from_a_poll_whatever_its_task_is_called(tmp_path, capsys):
    stdout = real_poll_report(tmp_path)
    printer = run_training.Printer()
    for kind in ("runner_retry", "runner_on_ok"):
        event = {"event": kind, "event_data": {"task": "any name at all", "host": "node0", "res": {"stdout": stdout}}}
        printer(event)
    printed = capsys.readouterr().out
    assert "[node0] step 30/120 (25%), loss 0.5000, 900 samples/s" in printed
    assert printed.count("step 30/120") == 1  # the second poll saw nothing new: no second line


def test_make_status_reads_the_same_report():
    report = {"kind": jobctl.POLL_REPORT, "job": "running", "metrics": {"step": 3}}
    event = {"event": "runner_on_ok", "event_data": {"host": "n", "res": {"stdout": json.dumps(report)}}}
    assert jobctl.node_report(event, jobctl.POLL_REPORT) == report
    assert jobctl.node_report(event, jobctl.LOG_REPORT) is None


def test_make_train_learns_the_run_id_from_the_fact_the_train_role_sets():
    # train_run_id is the one fact of the role that a reader outside it uses (role README, "Results other plays
    # read"); every other name the role sets is internal (__train_*) and may change.
    preflight = yaml.safe_load((ROOT / "ansible/roles/train/tasks/preflight.yml").read_text())
    assert any("train_run_id" in (task.get("ansible.builtin.set_fact") or {}) for task in preflight)
    printer = run_training.Printer()
    printer({"event": "runner_on_ok", "event_data": {"task": "any", "res": {"ansible_facts": {"train_run_id": "r1"}}}})
    assert printer.run_id == "r1"
