"""The node runner's view of a job: failure detection, heartbeats, and stopping the process group."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "ansible/roles/train/files/ddp_node.py"
spec = importlib.util.spec_from_file_location("ddp_node", RUNNER)
ddp_node = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ddp_node)

NODES = ["node0", "node1"]


def test_running_while_no_node_has_exited(tmp_path):
    now = time.time()
    for node in NODES:
        (tmp_path / f"heartbeat-{node}").write_text(f"{now:.0f}\n")
    assert ddp_node.job_state(tmp_path, NODES, 30, now) == {"job": "running"}


def test_failed_names_the_node_with_a_nonzero_exit(tmp_path):
    (tmp_path / "exit-node0").write_text("0\n")
    (tmp_path / "exit-node1").write_text("-9\n")
    state = ddp_node.job_state(tmp_path, NODES, 30, time.time())
    assert state["job"] == "failed"
    assert state["failed_node"] == "node1"


def test_a_node_whose_heartbeat_stopped_counts_as_failed(tmp_path):
    now = time.time()
    (tmp_path / "heartbeat-node0").write_text(f"{now:.0f}\n")
    (tmp_path / "heartbeat-node1").write_text(f"{now - 120:.0f}\n")
    state = ddp_node.job_state(tmp_path, NODES, 30, now)
    assert (state["job"], state["failed_node"]) == ("failed", "node1")


def test_succeeded_when_every_node_exited_zero(tmp_path):
    for node in NODES:
        (tmp_path / f"exit-{node}").write_text("0\n")
    assert ddp_node.job_state(tmp_path, NODES, 30, time.time()) == {"job": "succeeded"}


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
    while not (shared / "heartbeat-node0").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    poll = run_runner("poll", *common, "--nodes", "node0")
    assert poll.returncode == 0, poll.stderr
    assert json.loads(poll.stdout)["job"] == "running"

    pgid = int((node_dir / "pgid").read_text())
    stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "2")
    assert json.loads(stop.stdout) == {"stopped": True, "left_running": False}
    assert launcher.wait(timeout=10) != 0
    assert subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, check=False).returncode == 1

    poll = run_runner("poll", *common, "--nodes", "node0")
    assert poll.returncode == 1
    assert json.loads(poll.stdout)["job"] == "failed"


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
