"""The contract between the nodes' runner (ddp_node.py) and the controller's side (the launcher package's control
and train modules, the ddp_default stdout callback): reports are found by their kind, whatever the task that
printed them is called; run.json carries the record version the launcher reads."""

import ast
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from _modules import load
from _yaml_tasks import tasks_in
from ddp_launcher import artifacts, contract, control, train

ROOT = Path(__file__).resolve().parents[2]

RUNNER = ROOT / "ansible/roles/train/files/ddp_node.py"


def test_every_reader_knows_the_kinds_the_runner_prints():
    ddp_node = load("ddp_node", RUNNER)
    assert (contract.POLL_REPORT, contract.LOG_REPORT, contract.BUSY_REPORT) == (
        ddp_node.POLL_REPORT,
        ddp_node.LOG_REPORT,
        ddp_node.BUSY_REPORT,
    )
    files = RUNNER.parent
    ddp_env = load("ddp_env", files / "ddp_env.py")
    assert (contract.ENV_REPORT, contract.ENV_LIST_REPORT) == (ddp_env.PLACE_REPORT, ddp_env.LIST_REPORT)
    assert contract.STAGE_REPORT == load("ddp_data", files / "ddp_data.py").STAGE_REPORT
    # The callback in a process of its own: importing Ansible's plugins patches sys.intern, which breaks
    # torch.compile in every later test of this process.
    report = {"kind": ddp_node.POLL_REPORT, "metrics": {"step": 1}}
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import ddp_default; r = json.loads(sys.argv[2]); "
        "print(json.dumps([ddp_default.poll_report({'stdout': json.dumps(r)}), "
        "ddp_default.poll_report({'stdout': json.dumps(r | {'kind': sys.argv[3]})})]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT / "ansible/plugins/callback"), json.dumps(report), ddp_node.LOG_REPORT],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == [report, None]


def test_the_role_records_runs_through_the_launcher_that_holds_the_version(tmp_path):
    assert "ddp_launcher.artifacts" in (ROOT / "ansible/roles/train/tasks/record.yml").read_text()
    artifacts.record(tmp_path / "job-1", {"version": 0, "status": "running", "job": "job"})
    assert json.loads((tmp_path / "job-1" / "run.json").read_text())["version"] == contract.RUN_RECORD_VERSION
    artifacts.record(tmp_path / "job-1", {"status": "succeeded"})
    written = json.loads((tmp_path / "job-1" / "run.json").read_text())
    assert written == {"version": contract.RUN_RECORD_VERSION, "status": "succeeded", "job": "job"}


def test_a_run_recorded_by_a_newer_launcher_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "job-1"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"version": contract.RUN_RECORD_VERSION + 1, "job": "job"}))
    with pytest.raises(LookupError, match=f"run.json version {contract.RUN_RECORD_VERSION + 1};"):
        control.find_run("job-1", tmp_path)


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
    printer = train.Printer()
    for kind in ("runner_retry", "runner_on_ok"):
        event = {"event": kind, "event_data": {"task": "any name at all", "host": "node0", "res": {"stdout": stdout}}}
        printer(event)
    printed = capsys.readouterr().out
    assert "[node0] step 30/120 (25%), loss 0.5000, 900 samples/s now" in printed
    assert printed.count("step 30/120") == 1  # the second poll saw nothing new: no second line


def test_a_program_without_metrics_shows_its_newest_output_line_while_it_changes(capsys):
    printer = train.Printer()
    for output in ("epoch 1 loss 0.9", "epoch 1 loss 0.9", "epoch 2, elapsed 5 loss 0.7"):
        report = {"kind": contract.POLL_REPORT, "job": "running", "metrics": None, "output": output}
        printer({"event": "runner_retry", "event_data": {"host": "n0", "res": {"stdout": json.dumps(report)}}})
    lines = capsys.readouterr().out.splitlines()
    assert [line.rsplit(", elapsed ", 1)[0] for line in lines] == [
        "  [n0] epoch 1 loss 0.9",
        "  [n0] epoch 2, elapsed 5 loss 0.7",
    ]
    assert all(re.search(r", elapsed \d+m\d\ds$", line) for line in lines), lines


def test_make_status_reads_the_same_report():
    report = {"kind": contract.POLL_REPORT, "job": "running", "metrics": {"step": 3}}
    event = {"event": "runner_on_ok", "event_data": {"host": "n", "res": {"stdout": json.dumps(report)}}}
    assert contract.task_report(event, contract.POLL_REPORT) == report
    assert contract.task_report(event, contract.LOG_REPORT) is None


def test_make_train_learns_the_run_id_from_the_fact_the_train_role_sets():
    # train_run_id is the one fact of the role that a reader outside it uses (role README, "Results other plays
    # read"); every other name the role sets is internal (__train_*) and may change.
    preflight = yaml.safe_load((ROOT / "ansible/roles/train/tasks/preflight.yml").read_text())
    assert any("train_run_id" in (task.get("ansible.builtin.set_fact") or {}) for task in preflight)
    printer = train.Printer()
    printer({"event": "runner_on_ok", "event_data": {"task": "any", "res": {"ansible_facts": {"train_run_id": "r1"}}}})
    assert printer.run_id == "r1"


def task_titles() -> set[str]:
    """Every task title in the roles and playbooks (the literal part before any Jinja)."""
    titles = set()
    for path in [*ROOT.glob("ansible/**/*.yml"), *ROOT.glob("molecule/**/*.yml"), ROOT / "site.yml"]:
        for task in tasks_in(yaml.safe_load(path.read_text())):
            if isinstance(task.get("name"), str):
                titles.add(task["name"].split("{{")[0].strip())
    return {title for title in titles if len(title) >= MIN_TITLE}


# Shorter literals ("Start", "Check the") match titles by chance, not by intent.
MIN_TITLE = 12
# Python that reads what Ansible does: the launcher, the callback, the node runner, the roles' plugins and
# modules, molecule's shared helpers, the unit and e2e tests. The role scenarios' own tests are left out: they
# read a role's console output as its operator does (a rollback message quotes the check that failed).
CODE = ["ansible/ddp_launcher", "ansible/plugins", "ansible/roles/*/files", "ansible/roles/*/library"]
CODE += ["ansible/roles/*/filter_plugins", "molecule/shared", "train", "tests/unit", "tests/e2e", "tests/lab"]


def matches_a_title(literal: str, titles: set[str]) -> str | None:
    text = literal.strip()
    if len(text) < MIN_TITLE:
        return None
    return next((title for title in titles if title.startswith(text) or title in text), None)


def test_no_task_title_carries_meaning_in_python():
    titles = task_titles()
    assert "Start torchrun on the master" in titles  # the scan sees the roles' tasks
    found = []
    for pattern in CODE:
        for path in sorted(p for folder in ROOT.glob(pattern) for p in folder.rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # this scan's own examples
            for node in ast.walk(ast.parse(path.read_text())):
                literal = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
                if title := matches_a_title(literal, titles):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {title!r}")
    assert not found, "task titles read by Python code:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("literal", "matched"),
    [("Summarise the run", True), ("Start torchrun", True), ("  Start torchrun on the master  ", True), ("x", False)],
)
def test_the_title_scan_sees_a_title_or_its_prefix(literal, matched):
    assert (matches_a_title(literal, task_titles()) is not None) is matched


def test_a_report_is_found_after_other_output_and_only_of_its_kind():
    report = {"kind": contract.ENV_REPORT, "key": "k", "found": True, "placed": False}
    for stdout in (json.dumps(report), "\r\n" + json.dumps(report) + "\r\n", "Welcome to node0\n" + json.dumps(report)):
        assert contract.parse_report(stdout, contract.ENV_REPORT) == report, repr(stdout)
    assert contract.parse_report(json.dumps(report), contract.POLL_REPORT) is None
    assert contract.parse_report('{"kind": "ddp_env.place/1", "key"', contract.ENV_REPORT) is None  # cut short
    assert contract.parse_report(None, contract.ENV_REPORT) is None


def test_a_status_waits_for_the_run_s_lock_and_asks_the_nodes_only_if_the_run_did_not_end_meanwhile(
    tmp_path, monkeypatch
):
    """A detached run's watcher and its user may ask at once: the first to see the end alone collects it."""
    artifacts.record(tmp_path / "job-1", {"status": "running", "job": "job", "started": "now"})
    asked: list[str] = []
    monkeypatch.setattr(control, "act", lambda run, *_args, **_kwargs: asked.append(run.run_id))
    run = control.find_run("job-1", tmp_path)
    with control.control_lock(run):
        waiting = threading.Thread(target=control.status, args=(run,))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive()  # held by the lock
        artifacts.record(tmp_path / "job-1", {"status": "failed", "ended": "now"})  # what the holder's call found
    waiting.join(10)
    assert not waiting.is_alive() and asked == []
    assert not (tmp_path / "job-1" / ".locks").exists() and (tmp_path / ".locks" / "job-1.lock").is_file()
