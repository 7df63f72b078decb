"""The node runner's view of a job (failure detection across nodes), a job's life end to end (launch, poll, stop),
and its smaller commands: check-rendezvous, pack-changed, and the command line. Launch, poll and stop in detail:
test_node_runner_launch.py, test_node_runner_poll.py, test_node_runner_stop.py."""

import json
import os
import socket
import subprocess
import sys
import tarfile
import time

import pytest
from _node_runner import RUNNER, ddp_node, launched_pgid, launcher, node_args, run_runner

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


def test_rendezvous_check_refuses_a_taken_port():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_runner("check-rendezvous", "--port", str(port))
    assert result.returncode == 1
    assert "not free" in result.stderr


def test_rendezvous_check_master_and_peer_meet():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = subprocess.Popen(
        [sys.executable, str(RUNNER), "check-rendezvous", "--port", str(port), "--peers", "1", "--timeout", "10"]
    )
    peer = run_runner("check-rendezvous", "--port", str(port), "--master-addr", "127.0.0.1", "--timeout", "10")
    assert peer.returncode == 0, peer.stderr
    assert master.wait(timeout=15) == 0


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


def test_pack_changed_takes_only_what_the_run_wrote_newest_first_within_the_cap(tmp_path):
    work, marker = tmp_path / "work", tmp_path / "started"
    (work / "sub").mkdir(parents=True)
    (work / "old.txt").write_text("before the run")
    marker.write_text("run\n")
    os.utime(work / "old.txt", (1000, 1000))
    os.utime(marker, (2000, 2000))
    for name, mtime, size in (("snapshot.pt", 3000, 10), ("sub/log.txt", 4000, 10), ("big.bin", 5000, 100)):
        (work / name).write_bytes(b"x" * size)
        os.utime(work / name, (mtime, mtime))
    out = tmp_path / "work.tar"
    args = ["pack-changed", "--dir", str(work), "--since", str(marker), "--out", str(out), "--max-bytes", "25"]
    report = json.loads(run_runner(*args).stdout)
    assert report == {"files": ["sub/log.txt", "snapshot.pt"], "bytes": 20, "skipped": ["big.bin"]}
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["snapshot.pt", "sub/log.txt"]
    only_pt = json.loads(run_runner(*args, "--glob", "*.pt").stdout)
    assert only_pt["files"] == ["snapshot.pt"]


def test_pack_changed_edges_the_marker_s_own_time_the_exact_cap_and_the_order(tmp_path, capsys):
    work, marker, out = tmp_path / "work", tmp_path / "started", tmp_path / "work.tar"
    work.mkdir()
    marker.write_text("run\n")
    os.utime(marker, (2000, 2000))
    # at-start.txt was written in the marker's own instant: not after it. a.pt is the newest, b.pt older: newest
    # first is not the names' order either way. Together they fill the cap exactly.
    for name, mtime, size in (("at-start.txt", 2000, 1), ("b.pt", 3000, 15), ("a.pt", 4000, 10)):
        (work / name).write_bytes(b"x" * size)
        os.utime(work / name, (mtime, mtime))
    args = ["pack-changed", "--dir", str(work), "--since", str(marker), "--out", str(out), "--max-bytes", "25"]
    assert ddp_node.main(args) == 0
    assert json.loads(capsys.readouterr().out) == {"files": ["a.pt", "b.pt"], "bytes": 25, "skipped": []}
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["a.pt", "b.pt"]


def test_pack_changed_without_the_marker_packs_nothing(tmp_path, capsys):
    # The run never started (no marker): it wrote nothing, and the collection goes on.
    work = tmp_path / "work"
    work.mkdir()
    (work / "left-by-an-earlier-run.pt").write_text("x")
    args = ["pack-changed", "--dir", str(work), "--since", str(tmp_path / "started"), "--out", str(tmp_path / "w.tar")]
    assert ddp_node.main(args) == 0
    assert json.loads(capsys.readouterr().out) == {"files": [], "bytes": 0, "skipped": []}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_rendezvous_check_passes_a_free_port_and_a_reachable_master(capsys):
    # A master with no peers (one node) only proves the port free; a peer only needs the master to listen.
    assert ddp_node.main(["check-rendezvous", "--port", str(free_port()), "--timeout", "1"]) == 0
    with socket.create_server(("127.0.0.1", 0)) as master:
        port = str(master.getsockname()[1])
        assert ddp_node.main(["check-rendezvous", "--port", port, "--master-addr", "127.0.0.1", "--timeout", "5"]) == 0
    assert capsys.readouterr().err == ""


def test_rendezvous_check_refuses_a_port_held_with_so_reuseport(capsys):
    # Another program that allows reuse of its port still holds it: torchrun's store could not serve there alone.
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert ddp_node.main(["check-rendezvous", "--port", str(port)]) == 1
    assert f"rendezvous port {port} is not free" in capsys.readouterr().err


def test_rendezvous_master_fails_when_too_few_peers_come():
    port = free_port()
    # A process of its own: a master that never gives up fails this test at the timeout instead of hanging it.
    result = run_runner("check-rendezvous", "--port", str(port), "--peers", "1", "--timeout", "0.3", timeout_s=15)
    assert result.returncode == 1
    assert f"only 0 of 1 peers reached port {port}" in result.stderr


def test_rendezvous_peer_fails_when_the_master_cannot_be_reached(capsys):
    with socket.socket() as closed:  # bound, never listening: every connection to it is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        args = ["check-rendezvous", "--port", str(port), "--master-addr", "127.0.0.1", "--timeout", "0.3"]
        assert ddp_node.main(args) == 1
    error = capsys.readouterr().err
    assert f"cannot reach the master's rendezvous port 127.0.0.1:{port}" in error
    assert "refused" in error  # the cause, for the operator


# Each action's full call ({t}: the test's tmp_path, which stays empty) and the options it cannot run without.
FULL_CALLS = {
    "launch": (["--node-dir", "{t}/node", "--shared-dir", "{t}/shared", "--node", "node0", "--", "true"], 3),
    "poll": (["--node-dir", "{t}/node", "--shared-dir", "{t}/shared", "--node", "node0", "--nodes", "node0"], 4),
    "stop": (["--node-dir", "{t}/node"], 1),
    "read-log": (["--node-dir", "{t}/node"], 1),
    "check-rendezvous": (["--port", "1"], 1),
    "pack-changed": (["--dir", "{t}/work", "--since", "{t}/started", "--out", "{t}/work.tar"], 3),
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
