"""The node runner's stop: SIGTERM to the job's group first, with a grace period to finish in; then SIGTERM and
SIGKILL to whatever is left, in the group or out of it (by the job's tag); the container; and the exit status."""

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from _node_runner import ddp_node, launched_pgid, launcher, run_runner, running, wait_for


def test_stop_asks_the_group_first_and_gives_it_the_grace_to_finish(tmp_path):
    # Like torchrun on SIGTERM: it takes its time to stop its workers (deaf to further SIGTERMs meanwhile), then
    # exits by itself. A SIGKILL before it is done would leave no "cleaned-up" file.
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    ready, cleaned_up = tmp_path / "ready", tmp_path / "cleaned-up"
    job = f"trap 'trap \"\" TERM; sleep 2; touch \"{cleaned_up}\"; exit 0' TERM; touch '{ready}'; sleep 300 & wait"
    with launcher(node_dir, shared, ["sh", "-c", job]) as process:
        wait_for(ready.exists, "the job's SIGTERM trap")
        launched_pgid(node_dir)
        began = time.monotonic()
        stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "20")
        took_s = time.monotonic() - began
        assert (stop.returncode, json.loads(stop.stdout)) == (0, {"stopped": True, "left_running": False})
        assert cleaned_up.exists()
        assert took_s < 10, "stop waited out the grace period of a job that had ended"
        assert process.wait(timeout=20) == 0


def test_what_outlives_the_grace_gets_sigterm_then_sigkill_in_and_out_of_the_group(tmp_path):
    # Like torchrun and its ranks: a rank in a session of its own, which saves something on SIGTERM (only the job's
    # tag leads stop to it), under a group leader that ignores SIGTERM and does not carry the tag (only the group
    # leads stop to it). Durations no other run of this test shares, so that pgrep sees only this run's sleeps.
    node_dir, shared, ready = tmp_path / "node", tmp_path / "shared", tmp_path / "ready"
    stamp = f"{time.time_ns() % 10**9:09d}"
    rank_sleep, leader_sleep = f"sleep 301.{stamp}", f"sleep 302.{stamp}"
    rank_saved, rank = tmp_path / "rank-saved", tmp_path / "rank.sh"
    rank.write_text(f"trap 'sleep 0.2; touch \"{rank_saved}\"; exit 0' TERM\n{rank_sleep} &\nwait\n")
    tag = f"{ddp_node.JOB_TAG_VAR}={ddp_node._job_tag(node_dir)}"
    # The rank starts before the leader ignores SIGTERM (an ignored signal is inherited, and a shell cannot trap it).
    leader = f"env '{tag}' setsid sh '{rank}' & trap '' TERM; touch '{ready}'; exec {leader_sleep}"
    with launcher(node_dir, shared, ["env", "-u", ddp_node.JOB_TAG_VAR, "sh", "-c", leader]) as process:
        wait_for(lambda: ready.exists() and running(rank_sleep) and running(leader_sleep), "the job's processes")
        launched_pgid(node_dir)
        stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "0.5")
        assert (stop.returncode, json.loads(stop.stdout)) == (0, {"stopped": True, "left_running": False})
        assert rank_saved.exists(), "the rank got SIGKILL without a SIGTERM before it"
        process.wait(timeout=20)  # the leader is gone: the launcher recorded how
    final = json.loads((shared / "status-node0.json").read_text())
    assert (final["exit_code"], final["stopped"]) == (-9, True)
    said = "ddp_node: stopped: SIGTERM, then SIGKILL to what was left after the 0.5 s grace period\n"
    assert said in (node_dir / "node.log").read_text()
    assert ddp_node._job_processes(node_dir) == []
    assert not running(rank_sleep)
    assert not running(leader_sleep)


def test_stop_exits_1_when_something_of_the_job_is_left(tmp_path, monkeypatch, capsys):
    # A group that no signal ends: its only process is a zombie that its parent (this test) has not reaped yet.
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    zombie = subprocess.Popen(["true"], start_new_session=True)
    try:
        stat = Path(f"/proc/{zombie.pid}/stat")
        wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the zombie")  # its state field
        (node_dir / "pgid").write_text(f"{zombie.pid}\n")  # as launch records the group
        monkeypatch.setattr(ddp_node, "time", SimpleNamespace(monotonic=time.monotonic, sleep=lambda _s: None))
        assert ddp_node.main(["stop", "--node-dir", str(node_dir), "--grace", "0"]) == 1
        assert json.loads(capsys.readouterr().out) == {"stopped": True, "left_running": True}
    finally:
        zombie.wait()


def test_stop_removes_the_named_container_even_when_docker_fails(tmp_path):
    # A fake docker, first on PATH, that records its arguments and fails as one whose daemon is down does.
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\necho "Cannot connect to the Docker daemon" >&2\nexit 1\n')
    docker.chmod(0o755)
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    stop = run_runner("stop", "--node-dir", str(node_dir), "--container", "ddp-r1", env=env)
    assert calls.read_text() == "rm -f ddp-r1\n"
    # Its report alone, on stdout: docker's complaint is not stop's, and nothing of the job ran.
    assert (stop.returncode, stop.stderr) == (0, "")
    assert json.loads(stop.stdout) == {"stopped": False, "left_running": False}


def wait_for_tag(pid: int, node_dir: Path) -> None:
    """Until /proc shows the process's tag: Popen can return before exec has set its environment up (reads empty)."""
    entry, environ = f"{ddp_node.JOB_TAG_VAR}={ddp_node._job_tag(node_dir)}".encode(), Path(f"/proc/{pid}/environ")
    wait_for(lambda: entry in environ.read_bytes().split(b"\0"), "the tagged process's environment")


def test_a_job_is_alive_while_its_group_or_any_process_with_its_tag_is(tmp_path):
    node_dir, other_dir = tmp_path / "node", tmp_path / "other"
    node_dir.mkdir()
    other_dir.mkdir()
    tagged = {**os.environ, ddp_node.JOB_TAG_VAR: ddp_node._job_tag(node_dir)}
    # A rank that outlived torchrun (no group on record); a group whose processes do not carry the tag.
    with (
        subprocess.Popen(["sleep", "60"], env=tagged, start_new_session=True) as rank,
        subprocess.Popen(["sleep", "60"], start_new_session=True) as group,
    ):
        try:
            wait_for_tag(rank.pid, node_dir)
            assert ddp_node._job_alive(node_dir, None)
            assert ddp_node._job_alive(other_dir, group.pid)
        finally:
            rank.kill()
            group.kill()
    assert not ddp_node._job_alive(node_dir, group.pid)  # both ended and reaped


def test_checking_a_group_sends_it_no_signal(monkeypatch):
    sent = []
    monkeypatch.setattr(ddp_node.os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    assert ddp_node._group_alive(4242)
    assert sent == [(4242, 0)]


def test_the_search_for_the_jobs_processes_goes_on_past_those_it_cannot_read(tmp_path, monkeypatch):
    # Another user's processes, or ones that ended meanwhile: their environment cannot be read. Here every process's
    # but the rank's, and /proc lists the rank after at least one other (pid 1).
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    tagged = {**os.environ, ddp_node.JOB_TAG_VAR: ddp_node._job_tag(node_dir)}
    with subprocess.Popen(["sleep", "60"], env=tagged) as rank:
        try:
            wait_for_tag(rank.pid, node_dir)
            readable = f"/proc/{rank.pid}/environ"

            class OthersUnreadable(type(Path())):
                def read_bytes(self) -> bytes:
                    if self.name == "environ" and str(self) != readable:
                        raise PermissionError(13, "Permission denied", str(self))
                    return super().read_bytes()

            monkeypatch.setattr(ddp_node, "Path", OthersUnreadable)
            assert ddp_node._job_processes(node_dir) == [rank.pid]
        finally:
            rank.kill()


def test_a_stop_after_the_job_exited_signals_no_recorded_group(tmp_path):
    """Once the exit is recorded the group id is free for reuse: a later stop must not signal whoever has it."""
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    with launcher(node_dir, shared, ["true"]) as process:
        assert process.wait(timeout=20) == 0
    assert (node_dir / "exit").read_text() == "0\n"
    # Another program now leads a group whose id the run recorded.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (node_dir / "pgid").write_text(f"{stranger.pid}\n")
        stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "1")
        assert (stop.returncode, json.loads(stop.stdout)) == (0, {"stopped": False, "left_running": False})
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_stacks_taken_before_the_stop_end_the_log_once_however_often_it_is_stopped(tmp_path):
    # A docker run's ranks are out of py-spy's reach from the node: that is what its stacks say, which keeps this
    # test from depending on py-spy; test_hang.py takes real stacks through the whole launch.
    node_dir, shared = tmp_path / "node", tmp_path / "shared"
    with launcher(node_dir, shared, ["sleep", "300"]) as process:
        launched_pgid(node_dir)
        taken = run_runner("stacks", "--node-dir", str(node_dir), "--container", "ddp-r1")
        assert (taken.returncode, json.loads(taken.stdout)) == (0, {"taken": False})
        assert process.poll() is None, "taking the stacks stopped the job"
        for _ in range(2):
            assert run_runner("stop", "--node-dir", str(node_dir), "--grace", "5").returncode == 0
        process.wait(timeout=20)
    log = (node_dir / "node.log").read_text()
    assert log.count("its ranks' stacks when it was stopped:\n(no stacks: the ranks run in container ddp-r1)") == 1
    assert log.rstrip().endswith("(no stacks: the ranks run in container ddp-r1)")


def test_once_every_rank_has_left_the_rest_of_the_group_is_not_waited_for(tmp_path):
    # Like torchrun: on SIGTERM it passes the signal to its rank (in a session of its own, carrying RANK and the
    # job's tag), and after the rank has saved and left it takes its time to exit (its interpreter tearing torch
    # down). A rank that has not left is waited for: it saves before it goes.
    node_dir, shared, ready = tmp_path / "node", tmp_path / "shared", tmp_path / "ready"
    rank_saved, rank = tmp_path / "rank-saved", tmp_path / "rank.sh"
    rank.write_text(f"trap 'kill $!; sleep 1; touch \"{rank_saved}\"; exit 0' TERM\nsleep 300 &\nwait\n")
    leader = (
        f"RANK=0 setsid sh '{rank}' & rank=$!; "
        f"trap 'kill -TERM $rank; while kill -0 $rank 2>/dev/null; do sleep 0.05; done; sleep 30; exit 0' TERM; "
        f"touch '{ready}'; sleep 300 & wait"
    )
    with launcher(node_dir, shared, ["sh", "-c", leader]) as process:
        wait_for(lambda: ready.exists() and ddp_node._rank_processes(node_dir), "the job's rank")
        launched_pgid(node_dir)
        began = time.monotonic()
        stop = run_runner("stop", "--node-dir", str(node_dir), "--grace", "60")
        took_s = time.monotonic() - began
        assert (stop.returncode, json.loads(stop.stdout)) == (0, {"stopped": True, "left_running": False})
        assert rank_saved.exists(), "the rank was not waited for"
        assert took_s < 20, f"stop waited {took_s:.1f} s for a group whose ranks had all left"
        process.wait(timeout=20)
    log = (node_dir / "node.log").read_text()
    assert log.endswith("ddp_node: stopped: SIGTERM, and the job left within its 60 s grace period\n"), log
