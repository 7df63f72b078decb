"""Shared by the train/ tests: run torchrun, read metrics (pytest puts train/ on sys.path for ddp_train)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRAIN_DIR = ROOT / "train"
TRAIN = TRAIN_DIR / "train.py"
BENCH = TRAIN_DIR / "bench_allreduce.py"
SMOKE = TRAIN_DIR / "configs" / "cpu-smoke.yaml"


def env() -> dict[str, str]:
    # PYTHONPATH: the package ddp_train, for scripts that are not beside it (tests/unit/_kill_in_save.py).
    path = os.pathsep.join(filter(None, (str(TRAIN_DIR), os.environ.get("PYTHONPATH"))))
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": path,
    }


def torchrun_cmd(script: Path, *args: str, nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *map(str, args),
    ]


def start(cmd: list[str]) -> subprocess.Popen:
    """torchrun in a session of its own, so that kill_all() reaches its workers too."""
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT, start_new_session=True
    )


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every worker it started (a worker stuck in a collective ignores SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 180) -> subprocess.CompletedProcess:
    proc = start(torchrun_cmd(script, *args, nproc=nproc))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(proc)
        raise
    finally:
        if proc.poll() is None:
            kill_all(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def train(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """2-process run of train.py on the smoke config (num_workers 0 already) with extra arguments."""
    result = torchrun(TRAIN, "--config", str(SMOKE), *args, timeout=timeout)
    assert result.returncode == 0, f"train.py failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


@contextlib.contextmanager
def gloo_group_of_one() -> Iterator[Any]:
    """A gloo process group of this process alone, for running train/ code in-process; its DistInfo. Its store
    lives in this process (no TCP port to pick, so no race with another test for a free one)."""
    import torch
    import torch.distributed as dist
    from ddp_train.distributed import DistInfo

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistInfo(0, 1, 0, "gloo", torch.device("cpu"))
    finally:
        dist.destroy_process_group()
