"""The cluster's lock (ddp_node.py launch --cluster-lock, busy): held by the master's runner while its job runs,
named by `busy`, refused to a second launch, and released by a holder that dies without a word."""

import json
import signal
import subprocess
import sys

from _node_runner import RUNNER, end_leftovers, launched_pgid, node_args, run_runner, wait_for

HOLDER = {"run_id": "first-20261206-101500-beef", "job": "first", "owner": "ana@controller", "started": "10:15"}


def busy(lock) -> dict:
    done = run_runner("busy", "--lock", str(lock))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def hold(tmp_path, lock, metrics) -> subprocess.Popen:
    """The first run's runner: it holds the lock while its job (a sleep) runs."""
    holder = HOLDER | {"metrics": str(metrics)}
    argv = ["launch", *node_args(tmp_path / "first", tmp_path / "shared"), "--cluster-lock", str(lock)]
    return subprocess.Popen([sys.executable, str(RUNNER), *argv, "--holder", json.dumps(holder), "--", "sleep", "60"])


def test_no_lock_file_means_a_free_cluster(tmp_path):
    assert busy(tmp_path / "cluster.lock") == {
        "kind": "ddp_node.busy/1",
        "busy": False,
        "holder": None,
        "message": None,
    }


def test_a_running_run_holds_the_cluster_names_itself_and_keeps_a_second_from_starting(tmp_path):
    lock, metrics = tmp_path / "shared" / "cluster.lock", tmp_path / "metrics.jsonl"
    first = hold(tmp_path, lock, metrics)
    try:
        launched_pgid(tmp_path / "first")
        report = busy(lock)
        assert report["busy"] and report["holder"]["run_id"] == HOLDER["run_id"]
        assert report["message"] == (
            "the cluster is busy with run first-20261206-101500-beef (job first) of ana@controller, started 10:15, "
            "no metrics yet"
        )
        metrics.write_text(json.dumps({"step": 7, "loss": 1.5}) + "\n" + json.dumps({"step": 12, "loss": 1.2}) + "\n")
        assert busy(lock)["message"].endswith("started 10:15, at step 12")

        second = run_runner(
            "launch", *node_args(tmp_path / "second", tmp_path / "shared", "node0"), "--cluster-lock", str(lock),
            "--", "touch", str(tmp_path / "second-ran"),
        )  # fmt: skip
        assert second.returncode != 0
        assert not (tmp_path / "second-ran").exists()
        assert busy(lock)["holder"]["run_id"] == HOLDER["run_id"]  # the refused launch took nothing over
    finally:
        first.kill()
        first.wait()
        end_leftovers(tmp_path / "first")


def test_a_holder_that_dies_leaves_its_file_but_no_lock(tmp_path):
    lock = tmp_path / "shared" / "cluster.lock"
    first = hold(tmp_path, lock, tmp_path / "metrics.jsonl")
    launched_pgid(tmp_path / "first")
    assert busy(lock)["busy"]
    first.send_signal(signal.SIGKILL)  # the runner crashes: no stop, no cleanup
    first.wait()
    end_leftovers(tmp_path / "first")
    assert json.loads(lock.read_text())["run_id"] == HOLDER["run_id"]  # its word is still there ...
    wait_for(lambda: not busy(lock)["busy"], "the dead holder's lock released")  # ... and means nothing
    # The next run takes the cluster over.
    third = run_runner(
        "launch", *node_args(tmp_path / "third", tmp_path / "shared"), "--cluster-lock", str(lock),
        "--holder", json.dumps({"run_id": "third"}), "--", "true",
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert json.loads(lock.read_text())["run_id"] == "third"


def test_a_start_that_finds_the_cluster_taken_says_by_whom_and_starts_nothing(tmp_path):
    """Two launches at once both pass the busy check; the master's start is where the second learns it lost."""
    lock = tmp_path / "shared" / "cluster.lock"
    first = hold(tmp_path, lock, tmp_path / "metrics.jsonl")
    try:
        launched_pgid(tmp_path / "first")
        second = run_runner(
            "start", *node_args(tmp_path / "second", tmp_path / "shared"), "--cluster-lock", str(lock),
            "--", "touch", str(tmp_path / "second-ran"),
        )  # fmt: skip
        assert second.returncode == 3, second.stderr
        report = json.loads(second.stdout)
        assert report["pgid"] is None and report["busy"]["holder"]["run_id"] == HOLDER["run_id"]
        assert report["busy"]["message"].startswith(f"the cluster is busy with run {HOLDER['run_id']} (job first)")
        assert not (tmp_path / "second-ran").exists()
    finally:
        first.kill()
        first.wait()
        end_leftovers(tmp_path / "first")


def test_a_start_told_to_wait_takes_the_cluster_once_its_holder_ends(tmp_path):
    lock = tmp_path / "shared" / "cluster.lock"
    argv = ["launch", *node_args(tmp_path / "first", tmp_path / "shared"), "--cluster-lock", str(lock)]
    first = subprocess.Popen([sys.executable, str(RUNNER), *argv, "--holder", json.dumps(HOLDER), "--", "sleep", "3"])
    try:
        launched_pgid(tmp_path / "first")
        second = run_runner(
            "start", *node_args(tmp_path / "second", tmp_path / "shared"), "--cluster-lock", str(lock),
            "--holder", json.dumps({"run_id": "second"}), "--lock-wait", "60",
            "--", "touch", str(tmp_path / "second-ran"), timeout_s=60,
        )  # fmt: skip
        assert second.returncode == 0, second.stdout + second.stderr
        assert first.wait(timeout=5) == 0  # the first ran to its end: the second waited for it
        assert json.loads(second.stdout)["busy"] is None
        wait_for((tmp_path / "second-ran").exists, "the waiting start's job ran")
    finally:
        first.kill()
        first.wait()
        end_leftovers(tmp_path / "first")
        end_leftovers(tmp_path / "second")
