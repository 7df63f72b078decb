"""The node runner's view of a job (failure detection across nodes), a job's life end to end (launch, poll, stop),
and its smaller commands: collect, and the command line. Launch, poll and stop in detail:
test_node_runner_launch.py, test_node_runner_poll.py, test_node_runner_stop.py."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from _node_runner import RUNNER, ddp_node, end_leftovers, launched_pgid, launcher, node_args, run_runner

NODES = ["node0", "node1"]


def write_status(directory, node, beat, exit_code=None, ended=None, stopped=False):
    status = {"beat": beat, "exit_code": exit_code, "ended": ended, "stopped": stopped}
    (directory / f"status-{node}.json").write_text(json.dumps(status))


def test_running_while_no_node_has_exited(tmp_path):
    for node in NODES:
        write_status(tmp_path, node, beat=3)
    assert ddp_node.job_state(tmp_path, NODES, 30, time.time(), {}) == {"job": "running"}


def test_failed_names_the_node_with_a_nonzero_exit(tmp_path):
    write_status(tmp_path, "node0", beat=-1, exit_code=0)
    write_status(tmp_path, "node1", beat=-1, exit_code=-9)
    state = ddp_node.job_state(tmp_path, NODES, 30, time.time(), {})
    assert state["job"] == "failed"
    assert state["failed_node"] == "node1"


def test_of_failures_seen_in_one_poll_the_first_to_end_is_the_cause(tmp_path):
    # node1 was killed; node0 lost its peer and exited with an error a moment later: both seen in one poll.
    write_status(tmp_path, "node0", beat=-1, exit_code=1, ended=1000.8)
    write_status(tmp_path, "node1", beat=-1, exit_code=137, ended=1000.1)
    state = ddp_node.job_state(tmp_path, NODES, 30, 1003.0, {})
    assert (state["failed_node"], state["reason"]) == ("node1", "exit code 137")


def test_the_cause_is_the_first_to_end_even_when_seen_last(tmp_path):
    # node0's own failure is visible to its poller at once, node1's only after NFS's attribute cache expires.
    seen = {}
    write_status(tmp_path, "node0", beat=-1, exit_code=1, ended=1000.8)
    write_status(tmp_path, "node1", beat=3)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1001.0, seen)["failed_node"] == "node0"
    write_status(tmp_path, "node1", beat=-1, exit_code=137, ended=1000.1)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1004.0, seen)["failed_node"] == "node1"


def test_a_node_the_play_stopped_is_never_the_cause(tmp_path):
    write_status(tmp_path, "node0", beat=-1, exit_code=-15, ended=1000.0, stopped=True)
    write_status(tmp_path, "node1", beat=-1, exit_code=1, ended=1002.0)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1003.0, {})["failed_node"] == "node1"
    write_status(tmp_path, "node1", beat=-1, exit_code=-15, ended=1002.0, stopped=True)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1003.0, {}) == {"job": "stopped"}


def test_a_node_whose_heartbeat_stopped_counts_as_failed(tmp_path):
    now = time.time()
    write_status(tmp_path, "node0", beat=9)
    write_status(tmp_path, "node1", beat=4)
    # This poller saw node0 beat since, node1 not for two minutes.
    seen = {"node0": {"beat": 8, "since": now - 120}, "node1": {"beat": 4, "since": now - 120}}
    state = ddp_node.job_state(tmp_path, NODES, 30, now, seen)
    assert (state["job"], state["failed_node"]) == ("failed", "node1")
    assert seen["node0"] == {"beat": 9, "since": now}


def test_staleness_is_judged_by_the_pollers_clock_not_the_writers(tmp_path):
    # A node whose clock runs far behind (or ahead) still counts as alive while its count moves.
    seen = {}
    for beat, now in ((1, 1000.0), (2, 1020.0), (3, 1040.0)):
        for node in NODES:
            write_status(tmp_path, node, beat=beat)
        assert ddp_node.job_state(tmp_path, NODES, 30, now, seen) == {"job": "running"}
    assert ddp_node.job_state(tmp_path, NODES, 30, 1075.0, seen)["job"] == "failed"


def test_succeeded_when_every_node_exited_zero(tmp_path):
    for node in NODES:
        write_status(tmp_path, node, beat=-1, exit_code=0)
    assert ddp_node.job_state(tmp_path, NODES, 30, time.time(), {}) == {"job": "succeeded"}


def test_launch_poll_and_stop_leave_nothing_behind(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"

    def poll() -> tuple[int, dict]:
        result = run_runner("poll", *node_args(node_dir, shared), "--nodes", "node0")
        return result.returncode, json.loads(result.stdout)

    # A job whose child ignores nothing: a shell that starts a grandchild and waits.
    with launcher(node_dir, shared, ["sh", "-c", "sleep 300 & wait"]) as process:
        pgid = launched_pgid(node_dir)  # the job runs: the launcher has recorded its group
        code, report = poll()
        assert (code, report["job"], report["node_state"]) == (0, "running", "running")
        assert (report["exit_code"], report["started"]) == (None, ["node0"])
        stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "2")
        assert (stop.returncode, json.loads(stop.stdout)) == (0, {"stopped": True, "left_running": False})
        assert process.wait(timeout=10) != 0
    assert subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, check=False).returncode == 1

    # The play ended it, not a fault: the job reads as stopped, never as failed on this node.
    code, report = poll()
    assert code == 1
    assert (report["job"], report["node_state"], report["exit_code"]) == ("stopped", "exited", -15)
    assert json.loads((shared / "status-node0.json").read_text())["stopped"] is True


def test_a_node_whose_status_never_appears_counts_as_failed(tmp_path):
    # node0 beats on; node1's launch died before it wrote its first status.
    seen, start = {}, 1000.0
    for beat, now in enumerate((start, start + 20, start + 40, start + 60, start + 80), start=1):
        write_status(tmp_path, "node0", beat=beat)
        assert ddp_node.job_state(tmp_path, NODES, 30, now, seen) == {"job": "running"}
    write_status(tmp_path, "node0", beat=9)
    state = ddp_node.job_state(tmp_path, NODES, 30, start + ddp_node.NEVER_STARTED_AFTER_S + 1, seen)
    assert (state["job"], state["failed_node"]) == ("failed", "node1")
    assert state["reason"].startswith("never started")


def test_a_silence_of_exactly_stale_after_is_still_allowed(tmp_path):
    # "Has not moved for S seconds" fails once the silence is longer than S: a poll that lands exactly S seconds after
    # the last move still sees a running job.
    write_status(tmp_path, "node0", beat=4)
    seen = {"node0": {"beat": 4, "since": 1000.0}}
    for now in (1010.0, 1030.0):
        assert ddp_node.job_state(tmp_path, ["node0"], 30, now, seen) == {"job": "running"}
    state = ddp_node.job_state(tmp_path, ["node0"], 30, 1031.0, seen)
    assert state == {"job": "failed", "failed_node": "node0", "reason": "no heartbeat for 31 s"}


def test_a_missing_status_fails_only_once_the_never_started_allowance_is_exceeded(tmp_path):
    allowance = ddp_node.NEVER_STARTED_AFTER_S  # longer than stale_after: NFS can hide a new file that long
    seen, start = {}, 1000.0
    for beat, now in enumerate((start, start + allowance), start=1):
        write_status(tmp_path, "node0", beat=beat)
        assert ddp_node.job_state(tmp_path, NODES, 30, now, seen) == {"job": "running"}
    write_status(tmp_path, "node0", beat=3)
    state = ddp_node.job_state(tmp_path, NODES, 30, start + allowance + 1, seen)
    assert state == {"job": "failed", "failed_node": "node1", "reason": f"never started ({allowance + 1:.0f} s)"}


def test_a_status_that_appears_late_is_watched_from_when_it_appeared(tmp_path):
    seen = {}
    write_status(tmp_path, "node0", beat=1)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1000.0, seen) == {"job": "running"}
    write_status(tmp_path, "node0", beat=2)
    write_status(tmp_path, "node1", beat=0)  # seen for the first time, a minute after the first poll
    assert ddp_node.job_state(tmp_path, NODES, 30, 1060.0, seen) == {"job": "running"}
    write_status(tmp_path, "node0", beat=3)
    assert ddp_node.job_state(tmp_path, NODES, 30, 1090.0, seen) == {"job": "running"}
    write_status(tmp_path, "node0", beat=4)
    state = ddp_node.job_state(tmp_path, NODES, 30, 1091.0, seen)
    assert state == {"job": "failed", "failed_node": "node1", "reason": "no heartbeat for 31 s"}


def test_a_node_not_started_yet_or_done_does_not_end_the_check_of_the_others(tmp_path):
    # node0's status has not appeared yet (within its allowance), node1 finished, node2 went silent.
    write_status(tmp_path, "node1", beat=-1, exit_code=0)
    write_status(tmp_path, "node2", beat=4)
    seen = {"node0": {"beat": None, "since": 1000.0}, "node2": {"beat": 4, "since": 1000.0}}
    state = ddp_node.job_state(tmp_path, ["node0", "node1", "node2"], 30, 1031.0, seen)
    assert state == {"job": "failed", "failed_node": "node2", "reason": "no heartbeat for 31 s"}


def test_a_stale_stopping_marker_cannot_turn_a_failure_into_a_stop(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    node_dir.mkdir()
    (node_dir / "stopping").touch()  # left by an earlier run under the same id
    common = ["--node-dir", str(node_dir), "--shared-dir", str(shared), "--node", "node0"]
    assert run_runner("launch", *common, "--", "sh", "-c", "exit 3").returncode == 3
    state = json.loads(run_runner("poll", *common, "--nodes", "node0").stdout)
    assert (state["job"], state["failed_node"], state["reason"]) == ("failed", "node0", "exit code 3")


def test_poll_and_read_log_print_reports_of_their_kind(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    common = ["--node-dir", str(node_dir), "--shared-dir", str(shared), "--node", "node0"]
    run_runner("launch", *common, "--", "sh", "-c", "echo first; echo second")
    poll = json.loads(run_runner("poll", *common, "--nodes", "node0").stdout)
    assert (poll["kind"], poll["job"], poll["started"]) == (ddp_node.POLL_REPORT, "succeeded", ["node0"])
    whole = json.loads(run_runner("read-log", "--node-dir", str(node_dir)).stdout)
    assert (whole["kind"], whole["text"], whole["ended"]) == (ddp_node.LOG_REPORT, "first\nsecond\n", True)
    rest = json.loads(run_runner("read-log", "--node-dir", str(node_dir), "--offset", "6").stdout)
    assert (rest["text"], rest["offset"]) == ("second\n", whole["offset"])


def collect_args(tmp_path, *extra):
    """A collect call over tmp_path's work/, checkpoints/ and output/, against the marker tmp_path/started."""
    for name in ("work", "checkpoints", "output"):
        (tmp_path / name).mkdir(exist_ok=True)
    return [
        "collect", "--since", str(tmp_path / "started"), "--out", str(tmp_path / "collected.tar"),
        "--work-dir", str(tmp_path / "work"), "--checkpoints", str(tmp_path / "checkpoints"),
        "--metrics", str(tmp_path / "output"), *extra,
    ]  # fmt: skip


def stamp(path, mtime, size=10):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


def packed(tmp_path):
    with tarfile.open(tmp_path / "collected.tar") as tar:
        return sorted(tar.getnames())


def test_collect_takes_only_what_the_run_wrote_newest_first_within_the_cap(tmp_path):
    args = collect_args(tmp_path, "--max-bytes", "25")
    stamp(tmp_path / "started", 2000)
    stamp(tmp_path / "work/old.txt", 1000)
    for name, mtime, size in (("snapshot.pt", 3000, 10), ("sub/log.txt", 4000, 10), ("big.bin", 5000, 100)):
        stamp(tmp_path / "work" / name, mtime, size)
    # An older run's checkpoint stays behind; of this run's, the newest by name (the step) comes back.
    for name, mtime in (("ckpt-10.pt", 1500), ("ckpt-20.pt", 2500), ("ckpt-30.pt", 2600)):
        stamp(tmp_path / "checkpoints" / name, mtime)
    stamp(tmp_path / "output/metrics.jsonl", 1000)  # metrics come whatever their age: a resumed run appends
    stamp(tmp_path / "output/notes.txt", 3000)
    report = json.loads(run_runner(*args).stdout)
    assert report == {
        "archive": str(tmp_path / "collected.tar"),
        "checkpoints": ["ckpt-30.pt"],
        "metrics": ["metrics.jsonl"],
        "files": ["sub/log.txt", "snapshot.pt"],
        "bytes": 20,
        "skipped": ["big.bin"],
        "sha256": hashlib.sha256((tmp_path / "collected.tar").read_bytes()).hexdigest(),  # what the fetch checks
    }
    expected = ["checkpoints/ckpt-30.pt", "metrics/metrics.jsonl", "work/snapshot.pt", "work/sub/log.txt"]
    assert packed(tmp_path) == expected
    every = json.loads(run_runner(*args, "--all-checkpoints", "--glob", "*.pt").stdout)
    assert (every["checkpoints"], every["files"]) == (["ckpt-20.pt", "ckpt-30.pt"], ["snapshot.pt"])


def test_collect_edges_the_marker_s_own_time_the_exact_cap_and_the_order(tmp_path, capsys):
    args = collect_args(tmp_path, "--max-bytes", "25")
    stamp(tmp_path / "started", 2000)
    # at-start.txt was written in the marker's own instant: not after it. a.pt is the newest, b.pt older: newest
    # first is not the names' order either way. Together they fill the cap exactly.
    for name, mtime, size in (("at-start.txt", 2000, 1), ("b.pt", 3000, 15), ("a.pt", 4000, 10)):
        stamp(tmp_path / "work" / name, mtime, size)
    stamp(tmp_path / "checkpoints/ckpt-1.pt", 2000)
    assert ddp_node.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["files"], report["bytes"], report["checkpoints"]) == (["a.pt", "b.pt"], 25, [])
    assert packed(tmp_path) == ["work/a.pt", "work/b.pt"]


def test_collect_without_the_marker_packs_the_metrics_alone(tmp_path, capsys):
    # The run never started (no marker): it wrote nothing, and the collection goes on.
    args = collect_args(tmp_path)
    stamp(tmp_path / "work/left-by-an-earlier-run.pt", 1000)
    stamp(tmp_path / "checkpoints/ckpt-10.pt", 1000)
    stamp(tmp_path / "output/summary.json", 1000)
    assert ddp_node.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["files"], report["checkpoints"], report["metrics"]) == ([], [], ["summary.json"])
    assert packed(tmp_path) == ["metrics/summary.json"]


def test_a_peer_packs_its_own_log_alone_and_a_linked_log_is_left_out(tmp_path, capsys):
    log = tmp_path / "node/node.log"
    stamp(log, 1000)
    args = ["collect", "--out", str(tmp_path / "collected.tar"), "--node", "node1", "--log", str(log)]
    assert ddp_node.main(args) == 0
    assert packed(tmp_path) == ["logs/node1/node.log"]
    log.unlink()
    log.symlink_to("/etc/passwd")
    assert ddp_node.main(args) == 0
    assert packed(tmp_path) == []


def test_a_link_the_job_left_where_the_archive_goes_is_replaced_not_followed(tmp_path, capsys):
    # The fetch that reads the archive next runs as the connecting user (root on the lab): a link there would
    # hand it whatever the link names.
    target = tmp_path / "not-the-job-s.txt"
    target.write_text("kept")
    (tmp_path / "collected.tar").symlink_to(target)
    log = tmp_path / "node/node.log"
    stamp(log, 1000)
    args = ["collect", "--out", str(tmp_path / "collected.tar"), "--node", "node1", "--log", str(log)]
    assert ddp_node.main(args) == 0
    assert not (tmp_path / "collected.tar").is_symlink()
    assert packed(tmp_path) == ["logs/node1/node.log"]
    assert target.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collected.tar", "node", "not-the-job-s.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="root packs for another account")
def test_a_collect_for_an_account_that_is_not_there_fails_naming_it(tmp_path):
    args = ["collect", "--out", str(tmp_path / "c.tar"), "--node", "node1", "--as-user", "ddp-no-such-account"]
    done = subprocess.run(
        ["/usr/bin/python3", str(RUNNER), *args], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode != 0
    assert "collect as ddp-no-such-account: KeyError(" in done.stderr, done.stderr
    assert "collect as ddp-no-such-account on " in done.stderr and "failed" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left


@pytest.mark.skipif(os.geteuid() != 0, reason="root packs for another account")
def test_root_packs_as_the_job_s_user_so_a_swapped_directory_leads_it_nowhere(tmp_path):
    """Where Ansible connects as root: the job made its run's directory a link to a directory of root's alone.
    Root reading the log would follow it; the child that has become the job's user cannot."""
    job = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ddp-collect-job-"))  # a place another account can reach
    try:
        job.chmod(0o755)
        # Root's group may read it too: the child must have left root's groups behind as well as its uid.
        roots = job / "roots"
        roots.mkdir(mode=0o750)
        stamp(roots / "node.log", 1000)
        (roots / "node.log").chmod(0o640)
        (job / "run").symlink_to(roots)
        os.lchown(job / "run", 65534, 65534)
        outbox = tmp_path / "home" / "outbox" / "run-node1.tar"
        args = ["collect", "--out", str(outbox), "--node", "node1", "--log", str(job / "run" / "node.log")]
        # With root's groups, as sshd gives a root login: the child must leave them behind too.
        command = ["setpriv", "--groups", "0", "/usr/bin/python3", str(RUNNER), *args]

        for _ in range(2):  # the second time into root's directory as the first left it
            as_job = subprocess.run(
                [*command, "--as-user", "nobody"], capture_output=True, text=True, check=False, timeout=60
            )
            assert as_job.returncode == 0, as_job.stderr
        assert json.loads(as_job.stdout)["archive"] == str(outbox)
        with tarfile.open(outbox) as tar:
            assert tar.getnames() == []
        assert (outbox.stat().st_uid, stat.S_IMODE(outbox.stat().st_mode)) == (0, 0o600)
        assert stat.S_IMODE(outbox.parent.stat().st_mode) == 0o700

        as_root = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=60
        )  # what it guards against
        with tarfile.open(outbox) as tar:
            assert tar.getnames() == ["logs/node1/node.log"], as_root.stderr
    finally:
        shutil.rmtree(job)


def test_the_master_s_part_of_collect_needs_all_its_directories(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        ddp_node.main(["collect", "--out", str(tmp_path / "c.tar"), "--since", str(tmp_path / "started")])
    assert refused.value.code == 2
    assert (
        "collect --since (the master's part) needs --work-dir, --checkpoints and --metrics" in capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


# Each action's full call ({t}: the test's tmp_path, which stays empty) and the options it cannot run without.
FULL_CALLS = {
    "launch": (["--node-dir", "{t}/node", "--shared-dir", "{t}/shared", "--node", "node0", "--", "true"], 3),
    "poll": (["--node-dir", "{t}/node", "--shared-dir", "{t}/shared", "--node", "node0", "--nodes", "node0"], 4),
    "stop": (["--node-dir", "{t}/node"], 1),
    "read-log": (["--node-dir", "{t}/node"], 1),
    "collect": (["--out", "{t}/c.tar", "--node", "node0"], 1),
}
WITHOUT_ONE = [
    (action, options[i]) for action, (options, required) in FULL_CALLS.items() for i in range(0, 2 * required, 2)
]


@pytest.mark.parametrize(("action", "missing"), WITHOUT_ONE)
def test_a_call_without_a_required_option_is_refused_before_it_does_anything(
    action, missing, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(ddp_node.signal, "signal", lambda *_: None)  # were a launch to run in this process after all
    options = [option.replace("{t}", str(tmp_path)) for option in FULL_CALLS[action][0]]
    at = options.index(missing)
    with pytest.raises(SystemExit) as refused:
        ddp_node.main([action, *options[:at], *options[at + 2 :]])
    assert refused.value.code == 2
    assert f"the following arguments are required: {missing}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_call_without_an_action_is_refused(capsys):
    with pytest.raises(SystemExit) as refused:
        ddp_node.main([])
    assert refused.value.code == 2
    assert "required: action" in capsys.readouterr().err


def test_a_launch_without_a_command_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ddp_node.signal, "signal", lambda *_: None)  # were a launch to run in this process after all
    for no_command in ([], ["--"]):
        with pytest.raises(SystemExit) as refused:
            ddp_node.main(["launch", *node_args(tmp_path / "node", tmp_path / "shared"), *no_command])
        assert refused.value.code == 2
        assert capsys.readouterr().err.endswith(": error: launch needs a command after --\n")
    assert list(tmp_path.iterdir()) == []


def test_start_returns_once_the_job_runs_and_the_job_outlives_the_call(tmp_path):
    """As the script module runs it: the call returns (its pipes closed) while the job goes on; the runner file
    itself may be gone by then."""
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    marker = tmp_path / "done"
    job = ["sh", "-c", f"sleep 1; touch {marker}"]
    try:
        started = run_runner("start", *node_args(node_dir, shared), "--", *job, timeout_s=20)
        assert started.returncode == 0, started.stderr
        pgid = json.loads(started.stdout)["pgid"]
        assert pgid == ddp_node._read_int(node_dir / "pgid")
        assert not marker.exists()  # returned before the job ended
        # The end is seen as soon as it comes: a poll watching for 30 s answers once the job is over.
        watched = run_runner("poll", *node_args(node_dir, shared), "--nodes", "node0", "--wait", "30", timeout_s=20)
        assert (watched.returncode, json.loads(watched.stdout)["job"]) == (1, "succeeded")
        assert marker.exists()
        assert (node_dir / "exit").read_text() == "0\n"
    finally:
        end_leftovers(node_dir)


def test_start_of_a_command_that_cannot_run_records_its_failure(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    started = run_runner("start", *node_args(node_dir, shared), "--", str(tmp_path / "no-such-torchrun"))
    assert started.returncode == 0
    assert json.loads(started.stdout) == {"pgid": None, "exit_code": ddp_node.COULD_NOT_START, "busy": None}
    polled = run_runner("poll", *node_args(node_dir, shared), "--nodes", "node0")
    report = json.loads(polled.stdout)
    assert (polled.returncode, report["job"], report["reason"]) == (1, "failed", "exit code 127")
    assert "the job could not start" in (node_dir / "node.log").read_text()


def test_a_job_past_its_time_limit_is_stopped_and_fails_saying_so(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    try:
        started = run_runner("start", *node_args(node_dir, shared), "--timeout", "1", "--", "sleep", "300")
        assert started.returncode == 0
        watched = run_runner("poll", *node_args(node_dir, shared), "--nodes", "node0", "--wait", "30", timeout_s=40)
        report = json.loads(watched.stdout)
        assert (report["job"], report["reason"], report["exit_code"]) == ("failed", "ran past train_timeout_s", -15)
        assert "ran past its time limit of 1 s" in (node_dir / "node.log").read_text()
    finally:
        end_leftovers(node_dir)


def test_a_call_that_hangs_past_its_deadline_ends_naming_what_it_touches(tmp_path):
    # A FIFO nobody writes to blocks the log's open for ever, as a hung hard NFS mount blocks any system call.
    (tmp_path / "node").mkdir()
    os.mkfifo(tmp_path / "node" / "node.log")
    began = time.monotonic()
    done = run_runner("--deadline", "1", "--touches", "/data", "read-log", "--node-dir", str(tmp_path / "node"))
    assert done.returncode == ddp_node.DEADLINE_PASSED == 124
    assert time.monotonic() - began < 20
    error = json.loads(done.stdout)["error"]
    assert error.startswith("ddp_node.py read-log on ")
    where = error.split(" on ", 1)[1]
    assert where.startswith(f"{os.uname().nodename} did not finish within 1 s; it reads and writes /data:")
    # A link the job put in the log's place reads as an empty log, within a deadline far off.
    (tmp_path / "node" / "node.log").unlink()
    (tmp_path / "node" / "node.log").symlink_to("/etc/hostname")
    linked = run_runner("--deadline", "60", "read-log", "--node-dir", str(tmp_path / "node"))
    assert linked.returncode == 0, linked.stderr
    assert json.loads(linked.stdout)["text"] == ""
    (tmp_path / "node" / "node.log").unlink()
    os.mkfifo(tmp_path / "node" / "node.log")
    # Without a deadline the same call waits: no limit is the default.
    with pytest.raises(subprocess.TimeoutExpired):
        run_runner("read-log", "--node-dir", str(tmp_path / "node"), timeout_s=2)
