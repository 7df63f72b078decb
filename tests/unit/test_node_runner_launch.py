"""The node runner's launch: the status file over a job's life (the first status, heartbeats, the final status), the
job's own session and process group, and a SIGTERM from Ansible passed on to the job."""

import json
import signal
import sys
import threading
import time
from pathlib import Path

from _node_runner import ddp_node, launched_pgid, launcher, wait_for

STATUS_KEYS = {"beat", "exit_code", "ended", "stopped", "timed_out", "slowest_write_s", "worker_exit_code", "progress"}


def run_in_process(monkeypatch, heartbeat_every_s: float) -> None:
    """launch() called in this process: pytest's own SIGTERM handling stays, heartbeats come at the given pace."""
    monkeypatch.setattr(ddp_node.signal, "signal", lambda *_: None)
    monkeypatch.setattr(ddp_node, "HEARTBEAT_EVERY_S", heartbeat_every_s)


def read_status(shared: Path, node: str = "node0") -> dict:
    return json.loads((shared / f"status-{node}.json").read_text())


def test_the_first_status_is_there_before_the_job_starts_in_directories_launch_creates(tmp_path, monkeypatch):
    run_in_process(monkeypatch, heartbeat_every_s=3600)  # no heartbeat: the first status is all the job can see
    node_dir, shared = tmp_path / "runs/r1/node", tmp_path / "nfs/runs/r1"  # neither exists, nor their parents
    copy = tmp_path / "status-the-job-saw.json"
    before = time.time()
    # The job's only act: a copy of the status file as it found it.
    code = ddp_node.launch(node_dir, shared, "node0", ["cp", str(shared / "status-node0.json"), str(copy)])
    assert code == 0
    assert json.loads(copy.read_text()) == {
        "beat": 0,
        "exit_code": None,
        "ended": None,
        "stopped": False,
        "timed_out": False,
        "slowest_write_s": 0.0,
        "worker_exit_code": None,
        "progress": None,
    }
    final = read_status(shared)
    assert set(final) == STATUS_KEYS
    assert (final["beat"], final["exit_code"], final["stopped"]) == (-1, 0, False)
    assert before <= final["ended"] <= time.time()

    # A second run under the same directories (a retried launch) finds them there.
    assert ddp_node.launch(node_dir, shared, "node0", ["sh", "-c", "exit 4"]) == 4
    assert read_status(shared)["exit_code"] == 4


# The end of torchrun's report of a failed rank, as torchrun 2.x prints it.
TORCHRUN_REPORT = """Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_19:51:50
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 3 (pid: 4242)
  error_file: <N/A>
"""


def test_a_failed_node_records_its_program_s_own_exit_code_from_torchrun_s_report(tmp_path, monkeypatch):
    run_in_process(monkeypatch, heartbeat_every_s=3600)
    shared = tmp_path / "shared"
    torchrun = ["sh", "-c", f"printf '%s' '{TORCHRUN_REPORT}'; exit 1"]  # torchrun exits 1 whatever its ranks did
    assert ddp_node.launch(tmp_path / "node", shared, "node0", torchrun) == 1
    assert (read_status(shared)["exit_code"], read_status(shared)["worker_exit_code"]) == (1, 3)
    state = ddp_node.job_state(shared, ["node0"], 30.0, time.time(), {})
    assert (state["reason"], state["exit_code"]) == ("exit code 3", 3)
    # Without a report, the node's own exit code is the one there is.
    assert ddp_node.launch(tmp_path / "node", shared, "node0", ["sh", "-c", "exit 5"]) == 5
    state = ddp_node.job_state(shared, ["node0"], 30.0, time.time(), {})
    assert (read_status(shared)["worker_exit_code"], state["exit_code"]) == (None, 5)


def test_the_job_leads_a_session_and_process_group_of_its_own(tmp_path, monkeypatch):
    # So that stop's signal to the group reaches the whole job, and nothing of the launcher's.
    run_in_process(monkeypatch, heartbeat_every_s=3600)
    node_dir = tmp_path / "node"
    ids = [sys.executable, "-c", "import os; print(os.getpid(), os.getpgid(0), os.getsid(0))"]
    assert ddp_node.launch(node_dir, tmp_path / "shared", "node0", ids) == 0
    pid, pgid, sid = map(int, (node_dir / "node.log").read_text().split())
    assert pid == pgid == sid == launched_pgid(node_dir)


def test_heartbeats_count_up_and_the_final_status_is_the_last_write(tmp_path, monkeypatch):
    # The fourth write (the third heartbeat) is held for a second, as a hard NFS mount holds I/O, and the job ends
    # meanwhile: the final status must still land after it, not be overwritten by it.
    run_in_process(monkeypatch, heartbeat_every_s=0.02)
    shared, go = tmp_path / "shared", tmp_path / "go"
    beats: list[int] = []
    held_write_landed = threading.Event()
    write_status = ddp_node._write_status

    def held_write(path, **fields):
        beats.append(fields["beat"])
        if len(beats) == 4:
            go.touch()  # the job ends now
            time.sleep(1.0)
        write_status(path, **fields)
        if len(beats) == 4:
            held_write_landed.set()

    monkeypatch.setattr(ddp_node, "_write_status", held_write)
    # Waits for go; gives up after about 10 s, so that a launch whose heartbeats never reach the fourth write ends.
    job = ["sh", "-c", f'for i in $(seq 1000); do [ -e "{go}" ] && exit 0; sleep 0.01; done; exit 1']
    assert ddp_node.launch(tmp_path / "node", shared, "node0", job) == 0
    assert held_write_landed.wait(timeout=10)  # a heartbeat thread left running would write now
    assert beats[:-1] == list(range(len(beats) - 1)) and len(beats) >= 5, beats
    assert beats[-1] == -1
    assert read_status(shared)["beat"] == -1


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
    run_in_process(monkeypatch, heartbeat_every_s=0.05)
    shared = tmp_path / "shared"
    code = ddp_node.launch(tmp_path / "node", shared, "node0", [sys.executable, "-c", "import time; time.sleep(1)"])
    assert code == 0
    assert writes[0]["slowest_write_s"] == 0.0
    final = read_status(shared)
    assert final["beat"] == -1 and final["exit_code"] == 0
    assert 0.5 <= final["slowest_write_s"] < 5, final


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM installed (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_a_sigterm_to_the_launcher_reaches_the_jobs_group(tmp_path):
    # Ansible's async timeout, or a stop, signals the launcher: the job must end as it would on its own SIGTERM.
    node_dir, shared, ready = tmp_path / "node", tmp_path / "shared", tmp_path / "ready"
    job = f"trap 'exit 7' TERM; touch '{ready}'; sleep 30 & wait"
    with launcher(node_dir, shared, ["sh", "-c", job]) as process:
        wait_for(ready.exists, "the job's SIGTERM trap")
        wait_for(lambda: catches_sigterm(process.pid), "the launcher's SIGTERM handler")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 7
    assert read_status(shared)["exit_code"] == 7
