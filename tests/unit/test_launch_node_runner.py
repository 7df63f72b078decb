"""The node runner's view of a job: failure detection, heartbeats, and stopping the process group."""

import json
import subprocess
import sys
import time
from pathlib import Path

from _modules import load

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "ansible/roles/train/files/ddp_node.py"
ddp_node = load("ddp_node", RUNNER)

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


def run_runner(*args):
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, check=False)


def test_launch_poll_and_stop_leave_nothing_behind(tmp_path):
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    common = ["--node-dir", str(node_dir), "--shared-dir", str(shared), "--node", "node0"]
    # A job whose child ignores nothing: a shell that starts a grandchild and waits.
    launcher = subprocess.Popen(
        [sys.executable, str(RUNNER), "launch", *common, "--", "sh", "-c", "sleep 300 & wait"],
    )
    deadline = time.monotonic() + 10
    while not (shared / "status-node0.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    poll = run_runner("poll", *common, "--nodes", "node0")
    assert poll.returncode == 0, poll.stderr
    assert json.loads(poll.stdout)["job"] == "running"

    pgid = int((node_dir / "pgid").read_text())
    stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "2")
    assert json.loads(stop.stdout) == {"stopped": True, "left_running": False}
    assert launcher.wait(timeout=10) != 0
    assert subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, check=False).returncode == 1

    # The play ended it, not a fault: the job reads as stopped, never as failed on this node.
    poll = run_runner("poll", *common, "--nodes", "node0")
    assert poll.returncode == 1
    assert json.loads(poll.stdout)["job"] == "stopped"
    assert json.loads((shared / "status-node0.json").read_text())["stopped"] is True


def test_stop_also_kills_what_left_the_process_group(tmp_path):
    # Like torchrun's ranks: a process in a session of its own, under a leader that ignores SIGTERM.
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    common = ["--node-dir", str(node_dir), "--shared-dir", str(shared), "--node", "node0"]
    # A duration no other run of this test on the machine shares, so the final pgrep sees only this one's sleep.
    sleep = f"sleep 301.{time.time_ns() % 10**9:09d}"
    job = f"trap '' TERM; setsid {sleep} & wait"
    launcher = subprocess.Popen([sys.executable, str(RUNNER), "launch", *common, "--", "sh", "-c", job])
    deadline = time.monotonic() + 10
    while not ddp_node._job_processes(node_dir) or len(ddp_node._job_processes(node_dir)) < 2:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "1")
    assert json.loads(stop.stdout) == {"stopped": True, "left_running": False}
    launcher.wait(timeout=10)
    assert ddp_node._job_processes(node_dir) == []
    assert subprocess.run(["pgrep", "-f", sleep], capture_output=True, check=False).returncode == 1


def test_rendezvous_check_refuses_a_taken_port():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_runner("check-rendezvous", "--port", str(port))
    assert result.returncode == 1
    assert "not free" in result.stderr


def test_rendezvous_check_master_and_peer_meet():
    import socket

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
    import os
    import tarfile

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


def test_the_status_records_the_slowest_write_of_it(tmp_path, monkeypatch):
    # The third write (the second heartbeat) is held, as a hard NFS mount holds I/O while its server restarts.
    writes = []
    write_status = ddp_node._write_status

    def held_write(path, **fields):
        writes.append(fields)
        if len(writes) == 3:
            time.sleep(0.5)
        write_status(path, **fields)

    monkeypatch.setattr(ddp_node, "_write_status", held_write)
    monkeypatch.setattr(ddp_node, "HEARTBEAT_EVERY_S", 0.05)
    monkeypatch.setattr(ddp_node.signal, "signal", lambda *_: None)  # pytest's own SIGTERM handling stays
    shared = tmp_path / "shared"
    code = ddp_node.launch(tmp_path / "node", shared, "node0", [sys.executable, "-c", "import time; time.sleep(1)"])
    assert code == 0
    assert writes[0]["slowest_write_s"] == 0.0
    final = json.loads((shared / "status-node0.json").read_text())
    assert final["beat"] == -1 and final["exit_code"] == 0
    assert 0.5 <= final["slowest_write_s"] < 5, final
