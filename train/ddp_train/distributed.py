"""Process group set-up and teardown from torchrun's environment (env://), and rank-aware printing.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Started without it (plain
`python train.py`), the program runs as a single process with a group of one on a free local port.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM/SIGINT arrives (torchrun's stop), to unwind through finally."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_ranks() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment, (0, 1, 0) without it."""
    env = os.environ
    return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0"))


def resolve_backend(requested: str) -> str:
    """auto: nccl when CUDA is available, gloo otherwise. A forced nccl without CUDA is an error."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("dist.backend=nccl needs CUDA, and torch.cuda.is_available() is false here")
    return requested


def resolve_device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl" or torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices are visible")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup(backend: str = "auto", timeout_s: float = 600.0) -> DistInfo:
    """Create the default process group (env://) and bind this process to its device."""
    if "RANK" not in os.environ:  # not under torchrun: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world_size, local_rank = env_ranks()
    backend = resolve_backend(backend)
    device = resolve_device(backend, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return DistInfo(rank, world_size, local_rank, backend, device)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        # DDP's reducer keeps the backend alive through reference cycles; collected only at interpreter exit, its
        # gloo threads are torn down in arbitrary order and the process can abort after a successful run.
        gc.collect()
        dist.destroy_process_group()


@contextmanager
def process_group(backend: str = "auto", timeout_s: float = 600.0) -> Iterator[DistInfo]:
    """setup() ... teardown(), also when the body raises or a stop signal arrives.

    On success every rank meets in a barrier first, so no rank destroys the group while a peer still uses it.
    """
    info = setup(backend, timeout_s)
    try:
        yield info
        barrier(info)
    finally:
        teardown()


def install_signal_handlers() -> None:
    """SIGTERM (torchrun's stop) and SIGINT raise Terminated in the main thread; a second one is ignored."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def barrier(info: DistInfo) -> None:
    if dist.is_initialized():
        if info.backend == "nccl":
            dist.barrier(device_ids=[info.device.index])
        else:
            dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank src's obj on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else env_ranks()[0]


def print0(*args: Any, **kwargs: Any) -> None:
    """print on rank 0 only, flushed."""
    if rank() == 0:
        print(*args, **kwargs, flush=True)


def print_all(*args: Any) -> None:
    """print on every rank, prefixed with the rank, to stderr, flushed."""
    # One write per line: ranks share the same stderr, and print() writes the text and the newline apart.
    sys.stderr.write(" ".join([f"[rank {rank()}]", *map(str, args)]) + "\n")
    sys.stderr.flush()


def warn0(message: str) -> None:
    if rank() == 0:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)
