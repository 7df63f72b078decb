"""Shared by the node runner's tests (ansible/roles/train/files/ddp_node.py): the module, running it as a process,
waiting for what it does, and ending what a failed test left running."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _modules import load

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "ansible/roles/train/files/ddp_node.py"
ddp_node = load("ddp_node", RUNNER)


def run_runner(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """The runner as Ansible runs it: a process of its own (a hung one fails the test at timeout_s)."""
    command = [sys.executable, str(RUNNER), *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, env=env, timeout=timeout_s)


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 20) -> None:
    """Returns once condition() holds. The event is the proof; the deadline only bounds a test that fails."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)


def node_args(node_dir: Path, shared: Path, node: str = "node0") -> list[str]:
    return ["--node-dir", str(node_dir), "--shared-dir", str(shared), "--node", node]


def launched_pgid(node_dir: Path) -> int:
    """The job's process group, once the launcher has recorded it (stop needs it: wait for it before a stop)."""
    pgid_file = node_dir / "pgid"
    wait_for(lambda: pgid_file.exists() and pgid_file.read_text().endswith("\n"), "the launcher's pgid file")
    return int(pgid_file.read_text())


@contextlib.contextmanager
def launcher(node_dir: Path, shared: Path, job: list[str]) -> Iterator[subprocess.Popen]:
    """`ddp_node.py launch` as a process; whatever of it a failing test leaves running is killed afterwards."""
    process = subprocess.Popen([sys.executable, str(RUNNER), "launch", *node_args(node_dir, shared), "--", *job])
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        end_leftovers(node_dir)


def end_leftovers(node_dir: Path) -> None:
    """SIGKILL to the job's group and to every process with its tag: this test's own processes only. Written here
    rather than calling the runner's stop, which is the code under test (a mutant of it may kill nothing)."""
    pgid_file = node_dir / "pgid"
    if pgid_file.exists() and pgid_file.read_text().strip().isdigit():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
    marker = f"{ddp_node.JOB_TAG_VAR}={node_dir.resolve()}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)


def running(pattern: str) -> bool:
    """Whether a process whose command line contains pattern runs (pattern unique to the test)."""
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False).returncode == 0
