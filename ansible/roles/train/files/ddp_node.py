#!/usr/bin/env python3
"""Runs one node's part of a training job and reports on it; the train role runs it on every node.

    ddp_node.py launch --node-dir D --shared-dir S --node NAME [--mark-start FILE] [--timeout T]
                       [--cluster-lock L --holder JSON] -- COMMAND...
        Stamps FILE (the master: the run's start, for collect), then runs COMMAND (torchrun or `docker run ...
        torchrun`) in its own process group, logging to D/node.log. Its status file S/status-NAME.json counts
        heartbeats while COMMAND runs and records its exit code at the end. A COMMAND still running after T
        seconds is stopped. Exits with COMMAND's exit code.
        With --cluster-lock L (the master), holds L's lock while COMMAND runs, writing --holder's JSON into it; a
        lock someone else holds keeps COMMAND from starting.
    ddp_node.py busy --lock L
        Prints {"kind": "ddp_node.busy/1", "busy", "holder", "message"}: whether a run holds the cluster's lock L,
        and which (its run id, job, owner, start, newest metrics line). A lock file whose holder died holds
        nothing: the kernel, or the NFS server once the holder's lease lapses, releases it, so neither a crash
        nor a reboot leaves the cluster marked busy.
    ddp_node.py start ... (launch's arguments)
        launch in a process of its own, detached from the caller (Ansible's script call, which ends and removes
        this file): returns once the job runs, or once it could not start, printing {"pgid", "exit_code"}.
    ddp_node.py poll --node-dir D --shared-dir S --node NAME --nodes A,B,.. [--metrics FILE] [--stale-after S]
                     [--wait W] [--hang-after H] [--slurm-job J --slurm-hosts N1,N2,..]
        Prints one JSON object: this node's state, the job's state across all nodes ("running", "succeeded",
        "failed" with the name of the node that failed first, or "stopped": every node ended by `stop`), and the
        latest metrics line when FILE exists here. With W, it watches for up to W seconds and answers as soon
        as the job is over: a run's end is seen within a fraction of a second, not a poll period later.
        Exits 0 while everything runs (or waits in Slurm's queue), 1 once the job is over (success or failure), so
        Ansible's `until: rc != 0` waits exactly as long as the job runs. A node whose heartbeat count has not
        moved for more than S seconds of this node's own clock counts as failed (nodes' clocks need not agree).
        With H, a job whose node furthest behind reports no new rank step (DDP_PROGRESS_DIR) for H seconds is
        failed, hung; where no rank reports a step, one whose FILE shows no new step for H seconds.
        With --slurm-job J, a job still in Slurm's queue is "queued" (its place and Slurm's reason), and a job
        Slurm ended for its own reason (a node's failure, a time limit) fails with it, naming the node Slurm
        holds down.
    ddp_node.py arm --arm-dir A --workdir W [--export K ...] ... (launch's arguments)
        Under Slurm: writes A/step-HOST.sh (HOST: this node's short host name, its Slurm NodeName), which runs
        launch (--scheduler-step) with a copy of this file in D, as the job's user, when Slurm starts the
        batch job's step here. Prints {"host": HOST}.
    ddp_node.py submit --arm-dir A --name NAME --hosts H1,H2,..
        Submits the batch job that runs A/step-HOST.sh on each host (sbatch: one task per node, the nodes to
        itself) and prints {"job_id"} or {"error"}.
    ddp_node.py cancel --slurm-job J
        scancel J; prints {"cancelled", "refused", "owner", "said"}: Slurm refuses another user's job.
    ddp_node.py read-log --node-dir D [--offset N]
        Prints {"offset": END, "text": ..., "ended": BOOL}: this node's log from byte N on, and whether its part
        of the job has ended (for `make logs`, following).
    ddp_node.py stacks --node-dir D [--container NAME]
        Takes the Python stacks of this node's ranks (py-spy) into D/stacks, for the stop that follows to write at
        the log's end. For a hung run, every node's stacks are taken before any node's part is stopped: a rank
        stopped on one node would wake its peers elsewhere from the very wait their stacks are to show.
    ddp_node.py stop --node-dir D [--grace S] [--container NAME]
        Stops this node's process group (SIGTERM, then SIGKILL after the grace period), every process that
        inherited the job's tag (ranks run in sessions of their own) and the container, and reports whether
        anything of the run is left. Once every rank has left, what is left of the group is killed at once:
        torchrun's own exit, with nothing left to stop, is its interpreter tearing torch down. The node's status
        then records that the play, not a fault, ended it, and its log says how it was stopped; stacks that
        `stacks` took end the log, once.
    ddp_node.py collect --out TAR --node NAME --log LOG
                        [--since FILE --work-dir W --checkpoints C --metrics M [--all-checkpoints]
                         [--glob G ...] [--max-bytes N]] [--as-user USER]
        Writes TAR, which the controller fetches in one go: this node's LOG as logs/NAME/node.log and, on the
        master (--since), what the run left on shared storage: checkpoints/ (the newest *.pt in C written after
        FILE was, or all of them), metrics/ (*.json, *.jsonl in M) and work/ (the files under W modified after
        FILE whose relative path matches a glob, newest first until N bytes). FILE and the files are stamped by
        the same file server, so the nodes' clocks play no part. Prints what it packed and what it skipped, and
        the archive's sha256, which the fetch checks.
        With --as-user (root, for a job of USER's): a child that has become USER reads the job's files and
        writes them into TAR, which root opened in a directory of its own.

    python3 CODE.pyz unpack --dest D [--program P]
        The packed working directory travels as CODE.pyz: this file as its __main__.py and code.tar.gz beside it
        (ddp_pack_workdir writes both), so shipping it is one transfer and one process. Makes D (0700; it must not
        exist) and unpacks the code into it: regular files with their owner's modes only (u+rwX,go-rwx),
        directories 0700, symbolic links as they are; a name that leaves D is refused. Prints {"files": N}, or
        fails when D/P is no file.

Standard library only: nodes need nothing but the python3 that Ansible already uses. Ansible's script module
ships this file with every call, so nothing on a node that the job's user could change is ever run as another
user: the copy in the run's node directory that arm leaves is run by Slurm's step as the job's user only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import platform
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

HEARTBEAT_EVERY_S = 5.0  # pragma: no mutate (a pace: --stale-after, not this, decides what counts as silent)
# The "kind" of the JSON that poll and read-log print: the launcher's contract module (ansible/ddp_launcher/
# contract.py) defines them, and its readers find these reports in any task's result by it, whatever the task is
# called. This file runs alone on the nodes, so it carries a copy that test_progress_contract holds equal.
POLL_REPORT = "ddp_node.poll/1"
LOG_REPORT = "ddp_node.log/1"
BUSY_REPORT = "ddp_node.busy/1"
# A node whose status file has not appeared more than this long after the first poll never started. Generous: an
# NFS client can keep a negative lookup of a file created after it first looked for up to a minute.
NEVER_STARTED_AFTER_S = 90.0  # pragma: no mutate (an allowance: any over a minute does)
# torchrun's line for a failed rank's exit code, in its "Root Cause" report.
WORKER_EXIT = re.compile(rb"^\s*exitcode\s*:\s*(-?\d+)")
JOB_TAG_VAR = "DDP_NODE_JOB"  # pragma: no mutate (any name that no other program sets)
# Where the job's ranks report how far they got: each writes the step it has reached to rank-<RANK> in it.
PROGRESS_DIR_VAR = "DDP_PROGRESS_DIR"  # pragma: no mutate (its name is documented for programs to use)
# Slurm's job states after which nothing of the job runs any more (squeue's %T).
SLURM_ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "NODE_FAIL",
    "TIMEOUT",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
}
# Those of them that Slurm chose (a node that stopped answering, a limit), not the job's own steps.
SLURM_CAUSED = {"NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
SLURM_ASK_EVERY_S = 5.0  # pragma: no mutate (a pace for asking slurmctld while a job waits in the queue)
# How often a waiting poll looks at the status files again: the delay between a run's end and the launch seeing it.
WATCH_EVERY_S = 0.25  # pragma: no mutate (a pace: any fraction of a second)
# Exit code recorded for a command that could not even be started (the shell's "command not found").
COULD_NOT_START = 127
# This call's own exit, once --deadline has passed (the shell's code for a command killed by its timeout).
DEADLINE_PASSED = 124
# How often a launch that waits for the cluster tries its lock again.
LOCK_RETRY_S = 1.0
# start's exit when the cluster was taken by another run between the busy check and this start.
CLUSTER_TAKEN = 3


class ClusterBusy(RuntimeError):
    """Another run holds the cluster's lock: holder names it."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__(busy_message(holder))
        self.holder = holder


def hold_cluster(lock: Path, holder: dict[str, Any], wait_s: float = 0.0) -> int:
    """Takes the cluster's lock for as long as the returned descriptor stays open, and writes the holder into it
    for `busy` to show. A lock another run holds is tried again for up to wait_s; then ClusterBusy names that run."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    give_up = time.monotonic() + wait_s
    while True:
        try:
            # A POSIX lock, not flock: an NFS client's lock and one taken on the server's own disk (a master that
            # is also the NFS server) see each other only as POSIX locks.
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as error:
            held = error.errno in (errno.EACCES, errno.EAGAIN)
            if not held or time.monotonic() >= give_up:
                os.close(handle)
                if not held:
                    raise
                raise ClusterBusy(cluster_holder(lock) or {}) from None
        # Polled, not a blocking F_SETLKW: a blocked lock request on an NFS client outlives a stop of this run.
        time.sleep(LOCK_RETRY_S)
    os.ftruncate(handle, 0)
    os.pwrite(handle, (json.dumps(holder | {"pid": os.getpid(), "host": platform.node()}) + "\n").encode(), 0)
    os.fsync(handle)
    return handle


def cluster_holder(lock: Path) -> dict[str, Any] | None:
    """Who holds the cluster's lock ({} for a holder that has not written itself in yet), or None when nobody
    does: a file left by a run that died holds no lock."""
    try:
        handle = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(handle, "rb") as file:
        try:
            fcntl.lockf(file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a shared lock: it needs only read access
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            try:
                return json.loads(file.read() or b"{}")
            except json.JSONDecodeError:
                return {}
        return None


def busy_message(holder: dict[str, Any], metrics: dict[str, Any] | None = None) -> str:
    """The running run in one line: which, whose, since when and how far."""
    since = holder.get("started") or "an unknown time"
    progress = f", at step {metrics['step']}" if metrics and "step" in metrics else ", no metrics yet"
    return (
        f"the cluster is busy with run {holder.get('run_id', '?')} (job {holder.get('job', '?')}) of "
        f"{holder.get('owner', '?')}, started {since}{progress}"
    )


def busy(args: argparse.Namespace) -> int:
    holder = cluster_holder(args.lock)
    report: dict[str, object] = {"kind": BUSY_REPORT, "busy": holder is not None, "holder": holder, "message": None}
    if holder is not None:
        metrics = _last_line(Path(holder["metrics"])) if holder.get("metrics") else None
        report["message"] = busy_message(holder, metrics)
    print(json.dumps(report))
    return 0


def _take_cluster(node_dir: Path, lock: Path, holder: dict[str, Any], wait_s: float) -> None:
    """hold_cluster, and on refusal the run that has the cluster in node_dir/busy, for start to report."""
    try:
        hold_cluster(lock, holder, wait_s)
    except ClusterBusy as taken:
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "busy").write_text(json.dumps({"message": str(taken), "holder": taken.holder}) + "\n")
        raise


def launch(
    node_dir: Path,
    shared_dir: Path,
    node: str,
    command: list[str],
    *,
    mark_start: Path | None = None,
    timeout_s: float | None = None,
    grace_s: float = 15.0,
    cluster_lock: Path | None = None,
    holder: dict[str, Any] | None = None,
    lock_wait_s: float = 0.0,
    scheduler_step: bool = False,
) -> int:
    # Held until this process ends, whatever ends it: the lock goes with the last open descriptor.
    if cluster_lock is not None:
        _take_cluster(node_dir, cluster_lock, holder or {}, lock_wait_s)
    node_dir.mkdir(parents=True, exist_ok=True)
    shared_dir.mkdir(parents=True, exist_ok=True)
    if mark_start is not None:
        # Files newer than this were written by the run (collect). The master stamps it before its torchrun
        # hosts the rendezvous, so no rank anywhere can write anything earlier.
        mark_start.write_text(f"{node}\n")
    status = shared_dir / f"status-{node}.json"
    # A marker left by an earlier run under the same id must not make this run's failure look like a stop.
    (node_dir / "stopping").unlink(missing_ok=True)
    slowest_write_s = 0.0

    def write_status(**fields: Any) -> None:
        # The slowest write so far goes into the file: shared storage that held this node's I/O (an NFS server
        # restarting under a hard mount) shows there, measured on the node it held.
        nonlocal slowest_write_s
        started = time.monotonic()
        _write_status(status, slowest_write_s=round(slowest_write_s, 3), **fields)
        slowest_write_s = max(slowest_write_s, time.monotonic() - started)

    write_status(beat=0, exit_code=None)
    # Every process of the job inherits the tag, also those that leave the group: torchrun starts each rank in
    # a session of its own, so a torchrun killed mid-restart would otherwise leave its ranks running.
    env = {**os.environ, JOB_TAG_VAR: _job_tag(node_dir)}
    progress_dir = Path(env.setdefault(PROGRESS_DIR_VAR, str(node_dir / "progress")))
    progress_dir.mkdir(parents=True, exist_ok=True)
    with (node_dir / "node.log").open("ab") as log:
        log_start = log.tell()  # where this launch's output begins (an earlier launch of the run's may precede)
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    (node_dir / "pgid").write_text(f"{child.pid}\n")
    done = threading.Event()

    def beat() -> None:
        count = 0
        while not done.wait(HEARTBEAT_EVERY_S):
            count += 1
            write_status(beat=count, exit_code=None, progress=ranks_progress(progress_dir))

    beater = threading.Thread(target=beat, daemon=True)  # pragma: no mutate (joined below, unless interrupted)
    beater.start()
    # A stop (ddp_node.py stop, or a signal to this supervisor) reaches this process: pass it on to the job's group.
    signal.signal(signal.SIGTERM, lambda *_: _pass_stop_on(node_dir, child.pid, scheduler_step))
    timed_out = False
    try:
        code = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _note_in_log(node_dir, f"the job ran past its time limit of {timeout_s:.0f} s and is stopped")
        _signal_group(child.pid, signal.SIGTERM)
        try:
            code = child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _kill_job(node_dir, child.pid, signal.SIGKILL)
            code = child.wait()
    done.set()
    beater.join()
    # An exit the play caused (stop) is never the cause of a failure, only its consequence.
    stopped = (node_dir / "stopping").exists()
    worker = _worker_exit_code(node_dir / "node.log", log_start) if code else None
    write_status(
        beat=-1, exit_code=code, ended=time.time(), stopped=stopped, timed_out=timed_out, worker_exit_code=worker
    )
    (node_dir / "exit").write_text(f"{code}\n")
    return code


def _pass_stop_on(node_dir: Path, pgid: int, scheduler_step: bool) -> None:
    # Under Slurm the step's SIGTERM is a cancel (scancel, the run's stop): the job is stopped, it did not fail.
    if scheduler_step:
        with contextlib.suppress(OSError):
            (node_dir / "stopping").touch()
    _signal_group(pgid, signal.SIGTERM)


def ranks_progress(directory: Path) -> dict[str, int] | None:
    """The step the node's slowest rank has reached, and how many ranks report one (None: no rank reports)."""
    steps = []
    with contextlib.suppress(OSError):
        for path in directory.glob("rank-*"):
            if not path.name.removeprefix("rank-").isdigit():
                continue  # a rank's write in progress
            with contextlib.suppress(OSError, ValueError), _open_no_link(path) as file:
                steps.append(int(file.read(32)))
    return {"step": min(steps), "ranks": len(steps)} if steps else None


def _worker_exit_code(log: Path, start: int) -> int | None:
    """The program's own exit code, from torchrun's report of its first failed rank ("exitcode : 3") after byte
    start of the log: torchrun itself exits 1 whatever its workers exited with, and only the program's code says
    what kind of failure it was."""
    with contextlib.suppress(OSError), _open_no_link(log) as file:
        file.seek(max(start, file.seek(0, os.SEEK_END) - 16384))
        for line in reversed(file.read().splitlines()):
            found = WORKER_EXIT.search(line)
            if found:
                return int(found.group(1))
    return None


def start(args: argparse.Namespace, command: list[str]) -> int:
    """launch() in a grandchild of its own session: it outlives this call, and no pipe of the caller stays open."""
    args.node_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("pgid", "exit", "busy"):
        (args.node_dir / stale).unlink(missing_ok=True)
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the detached process: its effects are what the tests check)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        _detach_stdio()
        code = COULD_NOT_START
        try:
            code = _launch_from(args, command)
        except BaseException as error:  # the job's end must be recorded, whatever kept it from starting
            _record_no_start(args.node_dir, args.shared_dir / f"status-{args.node}.json", error)
        finally:
            os._exit(code & 0xFF)
    os.waitpid(child, 0)
    # A bound on a hung fork (a start takes milliseconds), beyond the time the start may wait for the cluster.
    deadline = time.monotonic() + 60 + args.lock_wait  # pragma: no mutate
    while True:
        pgid, exit_code = _read_int(args.node_dir / "pgid"), _read_int(args.node_dir / "exit")
        if pgid is not None or exit_code is not None or time.monotonic() > deadline:
            break
        time.sleep(0.02)  # pragma: no mutate (a polling pace)
    taken = _read_text(args.node_dir / "busy") if exit_code is not None else None
    print(json.dumps({"pgid": pgid, "exit_code": exit_code, "busy": json.loads(taken) if taken else None}))
    if taken:
        return CLUSTER_TAKEN
    return 0 if pgid is not None or exit_code is not None else 1


def _read_text(path: Path) -> str | None:
    with contextlib.suppress(OSError), _open_no_link(path) as file:
        return file.read().decode(errors="replace").strip() or None
    return None


def _launch_from(args: argparse.Namespace, command: list[str]) -> int:
    return launch(
        args.node_dir,
        args.shared_dir,
        args.node,
        command,
        mark_start=args.mark_start,
        timeout_s=args.timeout or None,
        cluster_lock=args.cluster_lock,
        holder=json.loads(args.holder) if args.holder else None,
        lock_wait_s=args.lock_wait,
        scheduler_step=getattr(args, "scheduler_step", False),
    )


def _detach_stdio() -> None:  # pragma: no cover (runs in the detached process)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _note_in_log(node_dir: Path, note: str) -> None:
    """One line of the runner's own at the end of the node's log. Never through a link the job put there, and a
    log the job took away costs the note, not the run's record."""
    with contextlib.suppress(OSError):
        handle = os.open(node_dir / "node.log", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(handle, "a") as log:
            log.write(f"ddp_node: {note}\n")


def _record_no_start(node_dir: Path, status: Path, error: BaseException) -> None:  # pragma: no cover (detached)
    _note_in_log(node_dir, f"the job could not start: {error}")
    with contextlib.suppress(OSError):
        _write_status(status, beat=-1, exit_code=COULD_NOT_START, ended=time.time(), slowest_write_s=0.0)
    with contextlib.suppress(OSError):
        (node_dir / "exit").write_text(f"{COULD_NOT_START}\n")


def _write_status(
    path: Path,
    *,
    beat: int,
    exit_code: int | None,
    ended: float | None = None,
    stopped: bool = False,
    timed_out: bool = False,
    slowest_write_s: float,
    worker_exit_code: int | None = None,
    progress: dict[str, int] | None = None,
) -> None:
    # Rewritten in place, never replaced: an NFS client's open() revalidates an existing file (close-to-open),
    # while a file created later can stay hidden behind a cached negative lookup for up to a minute.
    status = {
        "beat": beat,
        "exit_code": exit_code,
        "ended": ended,
        "stopped": stopped,
        "timed_out": timed_out,
        "slowest_write_s": slowest_write_s,
        "worker_exit_code": worker_exit_code,
        "progress": progress,
    }
    path.write_text(json.dumps(status) + "\n")


def _read_status(path: Path) -> dict[str, Any] | None:
    try:
        status = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # not started yet, or caught between truncate and write
    return status if isinstance(status, dict) else None


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def _job_tag(node_dir: Path) -> str:
    return str(node_dir.resolve())


def _job_processes(node_dir: Path) -> list[int]:
    """The pids whose environment carries this job's tag (a zombie's environment reads empty)."""
    marker = f"{JOB_TAG_VAR}={_job_tag(node_dir)}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        if marker in environ.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def _rank_processes(node_dir: Path) -> list[int]:
    """The job's processes that torchrun started as ranks (they carry RANK; torchrun itself does not)."""
    return [pid for pid in _job_processes(node_dir) if "RANK" in _environment(pid)]


def _job_alive(node_dir: Path, pgid: int | None) -> bool:
    return bool(pgid and _group_alive(pgid)) or bool(_job_processes(node_dir))


def _kill_job(node_dir: Path, pgid: int | None, sig: int) -> None:
    if pgid:
        _signal_group(pgid, sig)
    for pid in _job_processes(node_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _open_no_link(path: Path) -> BinaryIO:
    """path opened for reading, never through a link: a file of the job's replaced by a link reads as missing."""
    try:
        return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FileNotFoundError(errno.ENOENT, "a link, not followed", str(path)) from None
        raise


def _tail_lines(path: Path, size: int) -> list[bytes] | None:
    """The non-empty lines of the file's last `size` bytes (files that grow for a whole run are read from
    their end), or None when there is no file yet."""
    try:
        with _open_no_link(path) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return [line for line in f.read().splitlines() if line.strip()]
    except FileNotFoundError:
        return None


def _last_line(path: Path) -> dict[str, object] | None:
    lines = _tail_lines(path, 8192)
    for line in reversed(lines or []):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue  # a line still being written
    return None


def job_state(
    shared_dir: Path,
    nodes: list[str],
    stale_after_s: float,
    now: float,
    seen: dict[str, dict[str, Any]],
    *,
    hang_after_s: float = 0.0,
) -> dict[str, object]:
    """The whole job's state as seen from the shared run directory. seen (updated here) holds, per node, the
    last heartbeat count and rank progress this poller saw and when it first saw each, by this poller's clock."""
    statuses = {node: _read_status(shared_dir / f"status-{node}.json") for node in nodes}
    exits = {node: status.get("exit_code") if status else None for node, status in statuses.items()}
    failed = [node for node, code in exits.items() if code not in (None, 0) and not statuses[node].get("stopped")]
    if failed:
        cause = _first_to_end(failed, statuses)
        # The program's own code where torchrun reported it, else what the node's command exited with.
        worker = statuses[cause].get("worker_exit_code")
        exit_code = exits[cause] if worker is None else worker
        reason = "ran past train_timeout_s" if statuses[cause].get("timed_out") else f"exit code {exit_code}"
        return {"job": "failed", "failed_node": cause, "reason": reason, "exit_code": exit_code}
    if all(code == 0 for code in exits.values()):
        return {"job": "succeeded"}
    if all(code is not None for code in exits.values()):
        return {"job": "stopped"}
    for node, status in statuses.items():
        if status is None:
            first_missed = seen.setdefault(node, {"beat": None, "since": now})["since"]
            if now - first_missed > max(stale_after_s, NEVER_STARTED_AFTER_S):
                return {"job": "failed", "failed_node": node, "reason": f"never started ({now - first_missed:.0f} s)"}
            continue
        if exits[node] is not None:
            continue
        last = seen.get(node)
        if last is None or last["beat"] != status.get("beat"):
            seen[node] = (last or {}) | {"beat": status.get("beat"), "since": now}
        elif now - last["since"] > stale_after_s:
            return {"job": "failed", "failed_node": node, "reason": f"no heartbeat for {now - last['since']:.0f} s"}
    return _hung(statuses, seen, now, hang_after_s) if hang_after_s else {"job": "running"}


def _hung(
    statuses: dict[str, Any], seen: dict[str, dict[str, Any]], now: float, hang_after_s: float
) -> dict[str, object]:
    """A job is hung when the node whose ranks are furthest behind reports no new step for hang_after_s. Furthest
    behind: the lowest step reached (its peers went on into the collective that waits for it), then the longest
    without a new one. Judged once any rank reports a step; a node whose ranks report none then counts as behind."""
    running = {node: status for node, status in statuses.items() if status and status.get("exit_code") is None}
    if not any(status.get("progress") for status in running.values()):
        # A program that reports no steps (or none yet): the master's poll judges it by its metrics lines, if any.
        return {"job": "running", "steps_unreported": True}
    stalled = {}
    for node, status in running.items():
        step = (status.get("progress") or {}).get("step")
        mark = seen[node]
        if "step_since" not in mark or mark.get("step") != step:
            mark["step"], mark["step_since"] = step, now
        stalled[node] = (-1 if step is None else step, mark["step_since"])
    node = min(stalled, key=lambda name: stalled[name])
    step, since = stalled[node]
    if now - since <= hang_after_s:
        return {"job": "running"}
    where = f"at step {step}" if step >= 0 else "before reporting any step"
    return {
        "job": "failed",
        "failed_node": node,
        "hung": True,
        "reason": f"no progress for {now - since:.0f} s (train_hang_after_s): the ranks of {node} stopped {where}",
    }


def _metrics_stalled(
    metrics: dict[str, Any] | None, seen: dict[str, dict[str, Any]], now: float, hang_after_s: float, master: str
) -> dict[str, object] | None:
    """A program whose ranks report no step is judged by its metrics lines instead (the master's poll): hung once
    no line with a new step came for hang_after_s after the first. Which node holds it up is then unknown."""
    step = (metrics or {}).get("step")
    if step is None:
        return None  # no metrics line yet (or none with a step): nothing to judge it by
    mark = seen.setdefault("@metrics", {"step": step, "since": now})
    if mark["step"] != step:
        mark.update(step=step, since=now)
    if now - mark["since"] <= hang_after_s:
        return None
    return {
        "job": "failed",
        "failed_node": master,
        "hung": True,
        "reason": f"no new metrics line for {now - mark['since']:.0f} s (train_hang_after_s): the run's metrics "
        f"stopped at step {step}, and its ranks report no step (DDP_PROGRESS_DIR) that would name the node",
    }


def _first_to_end(failed: list[str], statuses: dict[str, Any]) -> str:
    """The node whose failure broke the run. Once one node dies its peers fail too (a lost connection), often
    before the first failure is visible on shared storage, so the order the poller sees them in proves
    nothing; the nodes' own end times do (cluster clocks agree to far less than that gap)."""
    return min(failed, key=lambda node: statuses[node].get("ended") or float("inf"))


# ------------------------------------------------------------------------------------------------ Slurm


def _slurm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def _short_host() -> str:
    return platform.node().split(".")[0]


def arm(args: argparse.Namespace, command: list[str]) -> int:
    """This node's part of the batch job: a copy of this runner (Ansible removes the one it shipped) and a step
    script that runs launch with it, written as the job's user, who alone runs them."""
    if not args.workdir.is_dir():
        # The master made it on shared storage before any node arms: a node that does not see it has its own.
        print(
            f"host {args.node} does not see the run's work dir {args.workdir}, which the master made: with several "
            "nodes it must be on storage every node shares (train_shared_dir / shared_dir, e.g. the NFS mount).",
            file=sys.stderr,
        )
        return 1
    args.node_dir.mkdir(parents=True, exist_ok=True)
    args.arm_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("pgid", "exit", "busy", "stopping"):
        (args.node_dir / stale).unlink(missing_ok=True)
    runner = args.node_dir / "ddp_node.py"
    shutil.copyfile(__file__, runner)
    argv = [sys.executable, str(runner), "launch", "--scheduler-step", "--node-dir", str(args.node_dir)]
    argv += ["--shared-dir", str(args.shared_dir), "--node", args.node, "--timeout", str(args.timeout)]
    argv += ["--mark-start", str(args.mark_start)] if args.mark_start else []
    # The run's environment as this node's play has it (sbatch passes on only the submitting node's).
    exports = "".join(f"export {key}={shlex.quote(os.environ[key])}\n" for key in args.export if key in os.environ)
    host = _short_host()
    step = args.arm_dir / f"step-{host}.sh"
    # The program runs in the run's work dir, as it does without Slurm (Slurm starts the step in the arm dir).
    script = (
        f"# {args.node}'s part of the run (ddp_node.py arm)\ncd {shlex.quote(str(args.workdir))} || exit 1\n"
        f"{exports}exec {shlex.join([*argv, '--', *command])}\n"
    )
    step.write_text(script)
    print(json.dumps({"host": host}))
    return 0


def submit(args: argparse.Namespace) -> int:
    """One batch job for the run: all its nodes to itself, one task on each, whose step runs that node's part."""
    hosts = args.hosts.split(",")
    # Each node wrote its part where it sees the run's directory: a part the master cannot see is a directory that
    # is not on shared storage, which would otherwise fail the job only once Slurm starts it.
    unseen = [host for host in hosts if not (args.arm_dir / f"step-{host}.sh").is_file()]
    if unseen:
        print(
            f"the master does not see the part of the run that {', '.join(unseen)} wrote to {args.arm_dir}: with "
            f"{len(hosts)} nodes it must be on storage every node shares (train_shared_dir / shared_dir, e.g. the "
            "NFS mount).",
            file=sys.stderr,
        )
        return 1
    step = args.arm_dir / "step.sh"
    step.write_text(f'exec /bin/sh {shlex.quote(str(args.arm_dir))}/step-"$(hostname -s)".sh\n')
    done = _slurm(
        "sbatch",
        "--parsable",
        f"--job-name={args.name}",
        f"--nodes={len(hosts)}",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--nodelist={','.join(hosts)}",
        f"--chdir={args.arm_dir}",
        f"--output={args.arm_dir}/slurm-%j.out",
        f"--wrap=exec srun --kill-on-bad-exit=0 /bin/sh {shlex.quote(str(step))}",  # pragma: no mutate
    )
    if done.returncode != 0:
        print(json.dumps({"error": (done.stderr or done.stdout).strip()}))
        return 1
    print(json.dumps({"job_id": done.stdout.strip().split(";")[0]}))
    return 0


def slurm_job(job_id: str) -> dict[str, Any] | None:
    """The Slurm job's state, owner and nodes, and while it waits, Slurm's reason and its place among the waiting
    jobs (highest priority first); None once Slurm no longer knows it."""
    done = _slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r|%u|%N")
    fields = done.stdout.strip().split("|") if done.returncode == 0 else []
    if len(fields) != 4:
        return None
    job: dict[str, Any] = dict(zip(("state", "reason", "user", "nodes"), fields, strict=True)) | {"id": job_id}
    if job["state"] == "PENDING":
        waiting = _slurm("squeue", "-h", "-t", "PENDING", "--sort=-p,i", "-o", "%i").stdout.split()
        job["position"] = waiting.index(job_id) + 1 if job_id in waiting else 1
        job["waiting"] = max(len(waiting), job["position"])
    return job


def _down_nodes(nodes: str) -> list[str]:
    """Those of a job's nodes that Slurm holds down or not responding (sinfo's state, '*': no answer)."""
    done = _slurm("sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T")
    states = [line.split("|") for line in done.stdout.split()]
    return [name for name, state in states if state.startswith(("down", "fail")) or state.endswith("*")]


def with_slurm_end(
    state: dict[str, Any], job: dict[str, Any] | None, job_id: str, hosts: dict[str, str], ended_for_s: float
) -> dict[str, Any]:
    """The job's state once Slurm ended its job. For a reason of Slurm's own (a node's failure, its time limit):
    that reason, naming the node Slurm holds down, over what the ranks' exits say (a lost peer). For any other
    end: once the nodes' records have had ended_for_s to show it, a part still counted as running never will."""
    if job is not None and job["state"] not in SLURM_ENDED:
        return state
    slurm_state = job["state"] if job else "ENDED"
    if slurm_state not in SLURM_CAUSED and (state["job"] != "running" or ended_for_s <= 0):
        return state
    inventory = {short: name for name, short in hosts.items()}
    down = [inventory.get(node, node) for node in _down_nodes(job["nodes"])] if job and job["nodes"] else []
    failed_node = down[0] if down else state.get("failed_node") or next(iter(hosts), "?")
    reason = f"Slurm ended job {job_id} {slurm_state}" + (f" ({', '.join(down)} down)" if down else "")
    return {"job": "failed", "failed_node": failed_node, "reason": reason, "exit_code": state.get("exit_code")}


def cancel(args: argparse.Namespace) -> int:
    done = _slurm("scancel", args.slurm_job)
    said = (done.stderr or done.stdout).strip()
    refused = done.returncode != 0 and re.search(r"[Pp]ermission denied|not the owner", said) is not None
    owner = (slurm_job(args.slurm_job) or {}).get("user") if refused else None
    print(json.dumps({"cancelled": done.returncode == 0, "refused": refused, "owner": owner, "said": said}))
    return 0


def poll(args: argparse.Namespace) -> int:
    seen_file = args.node_dir / "heartbeats-seen.json"  # pragma: no mutate (its only name: poll reads and writes it)
    try:
        seen = json.loads(seen_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        seen = {}
    nodes = args.nodes.split(",")
    watch_until = time.monotonic() + args.wait
    job = slurm_job(args.slurm_job) if args.slurm_job else None
    while job and job["state"] == "PENDING" and time.monotonic() < watch_until:
        time.sleep(min(SLURM_ASK_EVERY_S, watch_until - time.monotonic()))
        job = slurm_job(args.slurm_job)
    now = time.time()
    if job and job["state"] == "PENDING":
        seen = {}  # a node's silence counts from the job's start, not from its submission
        state: dict[str, Any] = {"job": "queued", "slurm": job}
    else:
        while True:
            now = time.time()
            state = job_state(args.shared_dir, nodes, args.stale_after, now, seen, hang_after_s=args.hang_after)
            if state["job"] != "running" or time.monotonic() >= watch_until:
                break
            time.sleep(WATCH_EVERY_S)
        if args.slurm_job and state["job"] in ("running", "failed", "stopped"):
            job = slurm_job(args.slurm_job)
            ended = job is None or job["state"] in SLURM_ENDED
            since = seen.setdefault("@slurm-ended", now) if ended else seen.pop("@slurm-ended", now)
            hosts = dict(zip(nodes, args.slurm_hosts.split(","), strict=False)) if args.slurm_hosts else {}
            state = with_slurm_end(state, job, args.slurm_job, hosts, now - since - args.stale_after)
            state |= {"slurm": job} if job else {}
    if state.pop("steps_unreported", False) and args.metrics:
        state = _metrics_stalled(_last_line(args.metrics), seen, now, args.hang_after, args.node) or state
    seen_file.write_text(json.dumps(seen))
    exit_code = _read_int(args.node_dir / "exit")
    launched = _read_int(args.node_dir / "pgid") is not None
    report: dict[str, object] = {
        "kind": POLL_REPORT,
        "node": args.node,
        "node_state": "exited" if exit_code is not None else "running" if launched else "not started",
        "exit_code": exit_code,
        "started": [node for node in nodes if (args.shared_dir / f"status-{node}.json").exists()],
        "heartbeat_age_s": _heartbeat_age(args.shared_dir / f"status-{args.node}.json", now),
        **state,
    }
    if args.metrics:
        report["metrics"] = _last_line(args.metrics)
        if report["metrics"] is None:
            # A program that writes no metrics still shows it is alive: its newest line of output.
            report["output"] = _last_output_line(args.node_dir / "node.log")
    print(json.dumps(report))
    return 0 if report["job"] in ("running", "queued") else 1


def _last_output_line(log: Path, max_chars: int = 160) -> str | None:
    """The newest non-empty line the job printed (its tail only: logs grow without bound)."""
    lines = _tail_lines(log, 4096)
    return lines[-1].decode(errors="replace").strip()[:max_chars] if lines else None


def _heartbeat_age(status: Path, now: float) -> float | None:
    try:
        return round(now - status.stat().st_mtime, 1)
    except FileNotFoundError:
        return None


def read_log(args: argparse.Namespace) -> int:
    try:
        with _open_no_link(args.node_dir / "node.log") as log:
            log.seek(args.offset)
            data = log.read()
    except FileNotFoundError:
        data = b""
    ended = (args.node_dir / "exit").exists()
    text = data.decode(errors="replace")
    print(json.dumps({"kind": LOG_REPORT, "offset": args.offset + len(data), "text": text, "ended": ended}))
    return 0


def stop(args: argparse.Namespace) -> int:
    # Once the job's exit is recorded its process group is gone, and its id may belong to someone else by now:
    # only processes that carry the job's tag are the job's.
    pgid = None if (args.node_dir / "exit").exists() else _read_int(args.node_dir / "pgid")
    (args.node_dir / "stopping").touch()
    if args.container:
        subprocess.run(["docker", "rm", "-f", args.container], capture_output=True, check=False)
    stopped = False
    if _job_alive(args.node_dir, pgid):
        # torchrun first, so that it stops its ranks itself; whatever is left after the grace period is killed.
        had_ranks = bool(_rank_processes(args.node_dir))
        if pgid:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + args.grace
        while _job_alive(args.node_dir, pgid) and time.monotonic() < deadline:
            if had_ranks and not _rank_processes(args.node_dir):
                # The ranks have saved and left: what remains is torchrun's own exit, its interpreter tearing torch
                # down (half a second) with nothing left to stop or save.
                _kill_job(args.node_dir, pgid, signal.SIGKILL)
            time.sleep(0.02)  # pragma: no mutate (a polling pace: slower or busy, the same outcome)
        how = (
            f"container {args.container} removed"
            if args.container
            else f"SIGTERM, and the job left within its {args.grace:g} s grace period"
        )
        if _job_alive(args.node_dir, pgid):
            _kill_job(args.node_dir, pgid, signal.SIGTERM)
            time.sleep(1)
            _kill_job(args.node_dir, pgid, signal.SIGKILL)
            time.sleep(0.5)
            how = f"SIGTERM, then SIGKILL to what was left after the {args.grace:g} s grace period"
        stopped = True
        # The log's last lines say who ended the run: torchrun, ended once its ranks have left, says nothing.
        _note_in_log(args.node_dir, f"stopped: {how}")
    left = _job_alive(args.node_dir, pgid)
    # Written once the ranks are stopped, so that the stacks end the log, where the failure shows its last lines;
    # once, however often the run is stopped.
    stacks = args.node_dir / "stacks"
    with contextlib.suppress(FileNotFoundError):
        text = stacks.read_text()
        stacks.rename(args.node_dir / "stacks.noted")
        _note_in_log(args.node_dir, "the run made no progress; its ranks' stacks when it was stopped:\n" + text)
    print(json.dumps({"stopped": stopped, "left_running": left}))
    return 1 if left else 0


def take_stacks(args: argparse.Namespace) -> int:
    """stacks: the ranks' stacks while they still hang, kept in the node directory for stop."""
    text = f"(no stacks: the ranks run in container {args.container})" if args.container else dump_stacks(args.node_dir)
    (args.node_dir / "stacks").write_text(text)
    print(json.dumps({"taken": not text.startswith("(no stacks")}))
    return 0


def dump_stacks(node_dir: Path) -> str:
    """The Python stack of each of the job's ranks on this node, by py-spy (beside the ranks' interpreter, as the
    training venv has it, beside this one, or on PATH): where a hung rank waits. Says why where none can be taken.
    Run as the job's user, like everything of this runner's that touches the job."""
    ranks = {pid: rank for pid in sorted(_job_processes(node_dir)) if (rank := _environment(pid).get("RANK"))}
    if not ranks:
        return "(no stacks: no rank of the job is left on this node)"
    interpreters = {Path(argv[0]).parent for pid in ranks if (argv := _command_line(pid))}
    beside = [folder / "py-spy" for folder in (*sorted(interpreters), Path(sys.executable).parent)]
    spy = next((str(path) for path in beside if path.is_file()), None) or shutil.which("py-spy")
    if spy is None:
        return "(no stacks: py-spy is not installed on this node)"
    dumps = []
    for pid, rank in ranks.items():  # torchrun itself, which only waits for its ranks, carries no RANK
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False)
        said = done.stdout if done.returncode == 0 else (done.stderr.strip().splitlines() or ["py-spy failed"])[-1]
        frames = [line for line in said.splitlines() if line.startswith(("    ", "Thread"))]
        dumps.append(f"rank {rank} (pid {pid}):" + ("\n" + "\n".join(frames) if frames else f" no stack: {said}"))
    return "\n".join(dumps)


def _command_line(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return [
            part.decode(errors="replace") for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part
        ]
    return []


def _environment(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(entry.decode(errors="replace").split("=", 1) for entry in entries if b"=" in entry)
    return {}


def changed_files(directory: Path, since: float, globs: list[str]) -> list[tuple[Path, int]]:
    """(relative path, size) of the files under directory modified after `since` matching a glob, newest first."""
    found = []
    for path in directory.rglob("*"):
        rel = path.relative_to(directory)
        if path.is_symlink() or not path.is_file() or not any(fnmatch.fnmatch(str(rel), g) for g in globs):
            continue
        if not os.access(path, os.R_OK):  # another account's file, linked in: not the job's to hand over
            continue
        stat = path.stat()
        if stat.st_mtime > since:
            found.append((stat.st_mtime, rel, stat.st_size))
    return [(rel, size) for _, rel, size in sorted(found, key=lambda item: item[0], reverse=True)]


def _newer_files(directory: Path, patterns: list[str], since: float) -> list[Path]:
    """The files directly in directory matching a pattern, modified after `since`, by name."""
    if not directory.is_dir():
        return []
    return sorted(
        path
        for path in directory.iterdir()
        if path.is_file()
        and not path.is_symlink()
        and any(fnmatch.fnmatch(path.name, p) for p in patterns)
        and path.stat().st_mtime > since
    )


def _own_file(path: Path) -> bool:
    """A regular file this process may read, reached without a link at its end."""
    try:
        return path.is_file() and not path.is_symlink() and os.access(path, os.R_OK)
    except OSError:  # a directory on the way that this account may not pass
        return False


def _pack(args: argparse.Namespace, file: BinaryIO) -> dict[str, Any]:
    """Writes this node's archive into file and returns what it holds."""
    started = args.since.stat().st_mtime if args.since and args.since.exists() else None
    checkpoints: list[Path] = []
    work: list[Path] = []
    skipped: list[str] = []
    total = 0
    if started is not None:  # without the marker the run never started: it wrote no checkpoint, nothing in work
        # Only what this run wrote: a failed run must not pass an older run's checkpoint off as its own.
        checkpoints = _newer_files(args.checkpoints, ["*.pt"], started)
        checkpoints = checkpoints if args.all_checkpoints else checkpoints[-1:]
        for rel, size in changed_files(args.work_dir, started, args.glob or ["*"]):
            if total + size > args.max_bytes:
                skipped.append(str(rel))
                continue
            work.append(rel)
            total += size
    metrics = _newer_files(args.metrics, ["*.json", "*.jsonl"], float("-inf")) if args.metrics else []
    with tarfile.open(fileobj=file, mode="w") as tar:
        if args.log and _own_file(args.log):
            tar.add(args.log, arcname=f"logs/{args.node}/node.log", recursive=False)
        for path in checkpoints:
            tar.add(path, arcname=f"checkpoints/{path.name}", recursive=False)
        for path in metrics:
            tar.add(path, arcname=f"metrics/{path.name}", recursive=False)
        for rel in work:
            tar.add(args.work_dir / rel, arcname=f"work/{rel}", recursive=False)
    return {
        "archive": str(args.out),
        "checkpoints": [path.name for path in checkpoints],
        "metrics": [path.name for path in metrics],
        "files": [str(rel) for rel in work],
        "bytes": total,
        "skipped": skipped,
    }


def _as_user(name: str) -> None:
    """Becomes account name for good (groups, then gid, then uid: the order in which each change is allowed)."""
    account = pwd.getpwnam(name)
    os.initgroups(name, account.pw_gid)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)


def collect(args: argparse.Namespace) -> int:
    """One archive per node: its log, and on the master what the run left on shared storage.

    With --as-user, this process is root and the job's files are that user's: a child that has become the user
    does the reading, so no link the job left can lead root anywhere, and it writes into a file that root opened
    in a directory of root's own (--out), which the fetch then reads."""
    if args.as_user:
        if os.geteuid() != 0:
            raise SystemExit(f"collect --as-user {args.as_user} needs root; this is uid {os.geteuid()}")
        args.out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Made under a fresh name and renamed over --out: a link left at --out is replaced, never followed, so the
    # fetch that reads --out next reads this archive.
    handle, part = tempfile.mkstemp(dir=args.out.parent, prefix=".collected-")  # pragma: no mutate (any name)
    with os.fdopen(handle, "wb") as file:
        if not args.as_user:
            report = _pack(args, file)
        else:
            reader, writer = os.pipe()
            child = os.fork()
            if child == 0:  # pragma: no cover (the child's coverage is the parent's result)
                os.close(reader)  # pragma: no mutate (the child's copy: it exits at once either way)
                code = 1  # pragma: no mutate (any code but 0 fails the collection)
                try:
                    _as_user(args.as_user)
                    os.write(writer, json.dumps(_pack(args, file)).encode())
                    file.flush()  # pragma: no mutate (tarfile's last record is larger than the buffer: no test sees it)
                    code = 0
                except Exception as error:  # whatever it was, the parent must hear of it
                    print(f"collect as {args.as_user}: {error!r}", file=sys.stderr, flush=True)
                finally:
                    os._exit(code)
            os.close(writer)
            with os.fdopen(reader) as answer:
                said = answer.read()
            _, status = os.waitpid(child, 0)  # pragma: no mutate (the pipe at EOF: the child is leaving)
            if not said or os.waitstatus_to_exitcode(status) != 0:
                Path(part).unlink()
                raise SystemExit(f"collect as {args.as_user} on {platform.node()} failed (see above)")
            report = json.loads(said)
    # The fetch checks what arrives against this (a copy cut short, or swapped on the way, is not unpacked).
    with Path(part).open("rb") as written:
        report["sha256"] = hashlib.file_digest(written, "sha256").hexdigest()
    Path(part).replace(args.out)
    print(json.dumps(report))
    return 0


def _private_dirs(dest: Path, rel: PurePosixPath) -> None:
    """Every directory from dest down to rel, made 0700 where missing (mkdir's parents would take the umask's)."""
    path = dest
    for part in rel.parts:
        path = path / part
        if not path.is_dir():
            path.mkdir(mode=0o700)


def unpack(args: argparse.Namespace) -> int:
    """The working directory packed beside this file in its zipapp, into a new directory of the job's user's."""
    args.dest.mkdir(mode=0o700)  # a new run's: an existing directory is someone else's doing
    files = 0
    with (
        zipfile.ZipFile(sys.argv[0]) as app,
        app.open("code.tar.gz") as packed,
        tarfile.open(fileobj=packed, mode="r|gz") as archive,
    ):
        for member in archive:
            rel = PurePosixPath(member.name)
            if rel.is_absolute() or ".." in rel.parts:
                raise SystemExit(f"unpack: {member.name} would land outside {args.dest}")
            _private_dirs(args.dest, rel.parent)
            target = args.dest / rel
            if member.isdir():
                _private_dirs(args.dest, rel)
            elif member.issym():
                target.symlink_to(member.linkname)
            elif member.isfile():
                mode = 0o700 if member.mode & 0o111 else 0o600
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                with archive.extractfile(member) as source, os.fdopen(os.open(target, flags, mode), "wb") as out:
                    shutil.copyfileobj(source, out)
                os.utime(target, (member.mtime, member.mtime))
                files += 1
    if args.program and not (args.dest / args.program).is_file():
        print(
            f"the shipped working directory holds no {args.program}: is it left out by an ignore file?", file=sys.stderr
        )
        return 1
    print(json.dumps({"files": files}))
    return 0


def _watchdog(deadline_s: float, call: str, touches: str) -> None:
    """Ends this process, naming what it waited on, once deadline_s have passed. A hard NFS mount whose server
    stopped answering holds a system call for as long as it takes, and Ansible's own timeout would say only that
    the task took too long."""

    def expire() -> None:
        time.sleep(deadline_s)
        message = (
            f"{call} on {platform.node()} did not finish within {deadline_s:.0f} s; it reads and writes {touches}: "
            "is that mount hung there (NFS server down, or the firewall)? Check with findmnt and ls on the node."
        )
        print(json.dumps({"error": message}), flush=True)
        print(message, file=sys.stderr, flush=True)
        os._exit(DEADLINE_PASSED)

    threading.Thread(target=expire, daemon=True).start()  # pragma: no mutate (daemon: it must not hold the exit)


def _add_slurm_parsers(sub: Any) -> None:
    """The options of a run under Slurm: its poll's, its step's, and arm, submit and cancel."""
    sub.choices["poll"].add_argument("--slurm-job", help="the run's Slurm job id")
    sub.choices["poll"].add_argument("--slurm-hosts", help="the nodes' Slurm names, in --nodes' order")
    sub.choices["launch"].add_argument("--scheduler-step", action="store_true", help="a SIGTERM is a cancel")
    armer = sub.add_parser("arm")
    for option, kind in (
        ("--node-dir", Path),
        ("--shared-dir", Path),
        ("--arm-dir", Path),
        ("--workdir", Path),
        ("--node", str),
    ):
        armer.add_argument(option, type=kind, required=True)
    armer.add_argument("--mark-start", type=Path)
    armer.add_argument("--timeout", type=float, default=0.0)
    armer.add_argument("--export", action="append", default=[], help="an environment variable the step sets")
    armer.add_argument("command", nargs=argparse.REMAINDER)
    submitter = sub.add_parser("submit")
    submitter.add_argument("--arm-dir", type=Path, required=True)
    submitter.add_argument("--name", required=True)
    submitter.add_argument("--hosts", required=True)
    sub.add_parser("cancel").add_argument("--slurm-job", required=True)


def _add_transfer_parsers(sub: Any) -> None:
    """What moves between the controller and the node in one archive: collect's and unpack's options."""
    packer = sub.add_parser("collect")
    packer.add_argument("--out", type=Path, required=True)
    packer.add_argument("--node", default="node")
    packer.add_argument("--log", type=Path)
    packer.add_argument("--since", type=Path)
    packer.add_argument("--work-dir", type=Path)
    packer.add_argument("--checkpoints", type=Path)
    packer.add_argument("--metrics", type=Path)
    packer.add_argument("--all-checkpoints", action="store_true")
    packer.add_argument("--glob", action="append")
    packer.add_argument("--max-bytes", type=int, default=1 << 30)
    packer.add_argument("--as-user", help="root packs as this account (the job's) into --out, a path of root's")
    unpacker = sub.add_parser("unpack")
    unpacker.add_argument("--dest", type=Path, required=True)
    unpacker.add_argument("--program", help="the program's path in the code, which must be there")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deadline", type=float, default=0.0, help="seconds this call may take; 0: no limit")
    parser.add_argument("--touches", default="shared storage", help="what the deadline's message names")
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("launch", "start", "poll", "stop"):
        p = sub.add_parser(name)
        p.add_argument("--node-dir", type=Path, required=True)
        if name != "stop":
            p.add_argument("--shared-dir", type=Path, required=True)
            p.add_argument("--node", required=True)
    for name in ("launch", "start"):
        sub.choices[name].add_argument("--mark-start", type=Path)
        sub.choices[name].add_argument("--timeout", type=float, default=0.0, help="seconds; 0: none")
        sub.choices[name].add_argument("--cluster-lock", type=Path)
        sub.choices[name].add_argument("--holder", help="JSON written into the cluster's lock")
        sub.choices[name].add_argument("--lock-wait", type=float, default=0.0, help="seconds to wait for the lock")
        sub.choices[name].add_argument("command", nargs=argparse.REMAINDER)
    sub.choices["poll"].add_argument("--nodes", required=True)
    sub.choices["poll"].add_argument("--metrics", type=Path)
    sub.choices["poll"].add_argument("--stale-after", type=float, default=30.0)
    sub.choices["poll"].add_argument("--wait", type=float, default=0.0, help="watch up to this many seconds")
    sub.choices["poll"].add_argument("--hang-after", type=float, default=0.0, help="seconds without a new step")
    _add_slurm_parsers(sub)
    for option, options in (("--grace", {"type": float, "default": 15.0}), ("--container", {})):
        sub.choices["stop"].add_argument(option, **options)
    stacker = sub.add_parser("stacks")
    stacker.add_argument("--node-dir", type=Path, required=True)
    stacker.add_argument("--container")
    sub.add_parser("busy").add_argument("--lock", type=Path, required=True)
    reader = sub.add_parser("read-log")
    reader.add_argument("--node-dir", type=Path, required=True)
    reader.add_argument("--offset", type=int, default=0)
    _add_transfer_parsers(sub)
    args = parser.parse_args(argv)
    # Not for launch and start, whose supervisor must not be forked from a process with a thread in it; start's
    # own wait is bounded.
    if args.deadline > 0 and args.action not in ("launch", "start"):
        _watchdog(args.deadline, f"ddp_node.py {args.action}", args.touches)
    if args.action in ("launch", "start", "arm"):
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error(f"{args.action} needs a command after --")
        if args.action == "start":
            return start(args, command)
        if args.action == "arm":
            return arm(args, command)
        return _launch_from(args, command)
    if args.action == "collect" and args.since and not (args.work_dir and args.checkpoints and args.metrics):
        parser.error("collect --since (the master's part) needs --work-dir, --checkpoints and --metrics")
    actions = {
        "poll": poll,
        "stop": stop,
        "stacks": take_stacks,
        "collect": collect,
        "unpack": unpack,
        "read-log": read_log,
        "busy": busy,
        "submit": submit,
        "cancel": cancel,
    }
    return actions[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
