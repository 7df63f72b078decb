"""The node runner's poll and read-log: the reports a node prints for Ansible's wait loop, `make status` and
`make logs`, read from what launch left in the node's directory and on shared storage."""

import json
import os
from pathlib import Path

from _node_runner import ddp_node, node_args

NOW = 1_000_000.0  # this poller's clock, as the tests set it


class FixedClock:
    """Stands in for ddp_node's time module: poll's `now` is what the test says."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def write_status(shared: Path, node: str, beat: int, exit_code: int | None = None) -> None:
    shared.mkdir(parents=True, exist_ok=True)
    status = {"beat": beat, "exit_code": exit_code, "ended": None, "stopped": False}
    (shared / f"status-{node}.json").write_text(json.dumps(status))


def poll(tmp_path, capsys, monkeypatch, *options: str, now: float = NOW) -> tuple[int, dict]:
    """One `ddp_node.py poll` of node0 (its own process in production: nothing but files carries over)."""
    (tmp_path / "node").mkdir(exist_ok=True)
    monkeypatch.setattr(ddp_node, "time", FixedClock(now))
    code = ddp_node.main(["poll", *node_args(tmp_path / "node", tmp_path / "shared"), *options])
    return code, json.loads(capsys.readouterr().out)


def launch_in_process(monkeypatch, tmp_path, job: list[str]) -> int:
    with monkeypatch.context() as patch:
        patch.setattr(ddp_node.signal, "signal", lambda *_: None)  # pytest's own SIGTERM handling stays
        return ddp_node.launch(tmp_path / "node", tmp_path / "shared", "node0", job)


def test_the_report_of_a_node_that_has_not_started(tmp_path, capsys, monkeypatch):
    write_status(tmp_path / "shared", "node1", beat=2)
    code, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0,node1")
    assert code == 0
    assert report == {
        "kind": ddp_node.POLL_REPORT,
        "node": "node0",
        "node_state": "not started",
        "exit_code": None,
        "started": ["node1"],
        "heartbeat_age_s": None,
        "job": "running",
    }


def test_the_report_of_a_node_whose_job_failed(tmp_path, capsys, monkeypatch):
    assert launch_in_process(monkeypatch, tmp_path, ["sh", "-c", "exit 3"]) == 3
    shared = tmp_path / "shared"
    write_status(shared, "node1", beat=5)
    os.utime(shared / "status-node0.json", (NOW - 12.34, NOW - 12.34))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2, "loss": 0.5}\n')
    code, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0,node1", "--metrics", str(metrics))
    assert code == 1  # the job is over: Ansible's wait ends
    assert report == {
        "kind": ddp_node.POLL_REPORT,
        "node": "node0",
        "node_state": "exited",
        "exit_code": 3,
        "started": ["node0", "node1"],
        "heartbeat_age_s": 12.3,  # by this poller's clock, in tenths of a second
        "job": "failed",
        "failed_node": "node0",
        "reason": "exit code 3",
        "metrics": {"step": 2, "loss": 0.5},
    }


def test_a_count_that_stands_still_between_two_polls_is_stale(tmp_path, capsys, monkeypatch):
    # Every poll is a process of its own: what it saw last time must come from the node's directory.
    shared, nodes = tmp_path / "shared", ["--nodes", "node0,node1", "--stale-after", "30"]
    write_status(shared, "node0", beat=4)
    write_status(shared, "node1", beat=4)
    code, first = poll(tmp_path, capsys, monkeypatch, *nodes, now=NOW)
    assert (code, first["job"]) == (0, "running")
    write_status(shared, "node0", beat=5)  # node0 beats on; node1's count stands still
    code, second = poll(tmp_path, capsys, monkeypatch, *nodes, now=NOW + 31)
    assert code == 1
    assert (second["job"], second["failed_node"], second["reason"]) == ("failed", "node1", "no heartbeat for 31 s")


def metrics_of(tmp_path, capsys, monkeypatch, content: bytes) -> object:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(content)
    write_status(tmp_path / "shared", "node0", beat=1)
    return poll(tmp_path, capsys, monkeypatch, "--nodes", "node0", "--metrics", str(metrics))[1]["metrics"]


def test_the_metrics_are_the_last_complete_line(tmp_path, capsys, monkeypatch):
    lines = b'{"step": 1}\n{"step": 2}\n\n'
    assert metrics_of(tmp_path, capsys, monkeypatch, lines) == {"step": 2}
    # The trainer is writing the next line as the poll reads.
    assert metrics_of(tmp_path, capsys, monkeypatch, lines + b'{"step": 3, "lo') == {"step": 2}
    assert metrics_of(tmp_path, capsys, monkeypatch, b"") is None
    (tmp_path / "metrics.jsonl").unlink()  # not written yet, or on another node than the master
    _, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0", "--metrics", str(tmp_path / "metrics.jsonl"))
    assert report["metrics"] is None


def test_without_metrics_the_report_carries_the_newest_output_line(tmp_path, capsys, monkeypatch):
    # A user's program that writes no metrics file still shows it is alive, with what it printed last.
    (tmp_path / "node").mkdir()
    log = tmp_path / "node" / "node.log"
    log.write_bytes(b"epoch 0 batch 10\n" * 400 + b"epoch 3 batch 7 \xff " + b"y" * 300 + b"\n\n  \n")
    write_status(tmp_path / "shared", "node0", beat=1)
    absent = str(tmp_path / "metrics.jsonl")
    _, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0", "--metrics", absent)
    assert report["metrics"] is None
    assert report["output"] == ("epoch 3 batch 7 \ufffd " + "y" * 300)[:160]
    # With metrics, the metrics say it; a node that is not the master reports neither.
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')
    _, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0", "--metrics", absent)
    assert "output" not in report
    _, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0")
    assert "output" not in report and "metrics" not in report
    log.unlink()  # not started yet
    (tmp_path / "metrics.jsonl").unlink()
    _, report = poll(tmp_path, capsys, monkeypatch, "--nodes", "node0", "--metrics", absent)
    assert report["output"] is None


def test_the_metrics_come_from_the_last_8_kib_of_the_file(tmp_path, capsys, monkeypatch):
    # The metrics file grows for the whole run; each poll reads only its end.
    tail = 8192
    earlier = b'{"step": 1}\n' * 1000
    longest = json.dumps({"step": 2, "pad": ""}).encode()
    longest = json.dumps({"step": 2, "pad": "x" * (tail - len(longest) - 1)}).encode() + b"\n"
    assert len(longest) == tail
    # A line that fills those 8 KiB is read whole.
    assert metrics_of(tmp_path, capsys, monkeypatch, earlier + longest) == json.loads(longest)
    # Nothing before them is read: an 8 KiB line still being written hides the earlier ones.
    assert metrics_of(tmp_path, capsys, monkeypatch, earlier + b"x" * tail) is None


def test_read_log_replaces_what_is_not_utf8_and_exits_0(tmp_path, capsys, monkeypatch):
    # A rank's output cut mid-character, or a binary's: the report must still be JSON, and `make logs` go on.
    assert launch_in_process(monkeypatch, tmp_path, ["printf", "loss \\377 0.5\\n"]) == 0
    assert ddp_node.main(["read-log", "--node-dir", str(tmp_path / "node")]) == 0
    report = json.loads(capsys.readouterr().out)
    # The offset counts bytes of the log (where the next read starts), not characters of the text.
    assert (report["text"], report["offset"], report["ended"]) == ("loss \ufffd 0.5\n", 11, True)
