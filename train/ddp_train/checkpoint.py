"""Checkpoints: atomic files, a SHA-256 beside each, keep-last-K, and choosing which one to resume from.

Layout of <dir>: `ckpt-00000123.pt` (state after 123 optimizer steps) and `ckpt-00000123.pt.sha256`
(`sha256sum -c` format). A file is written to a temporary name in the same directory, flushed and fsynced,
renamed over the final name, and the directory is fsynced: a reader sees the old file or the whole new one.
Files are read with `torch.load(weights_only=True)`: no pickled code runs from shared storage.

Rank 0's `Writer` does the writing (then keep-last pruning), either in the caller's thread or, staged, on a
background thread from a CPU copy of the state (`to_cpu`) while training goes on.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

FORMAT_VERSION = 1  # pragma: no mutate (a new number is a deliberate format change; refusing others is tested)
NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")
REQUIRED = ("format_version", "step", "model", "optimizer", "scaler", "scheduler", "data", "rng", "config")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, truncated, corrupt, or not ours)."""


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint in directory, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name))]
    return sorted(found)


# ------------------------------------------------------------------------------------------------ files


class _HashingWriter:
    """File-like object for torch.save: writes through to the file and hashes on the way."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.sha256 = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()  # pragma: no mutate (only torch.save's call: _atomic_write flushes before its fsync)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; others on the shared storage may read checkpoints
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_save(state: dict[str, Any], path: Path) -> str:
    """Write state to path atomically, then its .sha256; returns the digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = ""  # pragma: no mutate (always set by write_state before it is read)

    def write_state(file: IO[bytes]) -> None:
        nonlocal digest
        writer = _HashingWriter(file)
        torch.save(state, writer)  # type: ignore[arg-type]
        digest = writer.sha256.hexdigest()

    _atomic_write(path, write_state)
    _atomic_write(_sidecar(path), lambda f: f.write(f"{digest}  {path.name}\n".encode()))
    _fsync_dir(path.parent)
    return digest


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(path: Path, verify: bool = True) -> dict[str, Any]:
    """Read and check one checkpoint; CheckpointError says why it is unusable."""
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    sidecar = _sidecar(path)
    if verify and sidecar.is_file():
        expected = sidecar.read_text().split()[0] if sidecar.read_text().strip() else ""
        if _sha256(path) != expected:
            raise CheckpointError(f"{path}: SHA-256 does not match {sidecar.name} (truncated or corrupt)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged archive
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED):
        raise CheckpointError(f"{path}: not a training checkpoint of this program (keys missing)")
    if state["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format {state['format_version']}, this program reads {FORMAT_VERSION}")
    return state


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest keep_last checkpoints (0 keeps all) and stale temporary files."""
    removed = []
    for stale in directory.glob(".ckpt-*.tmp"):  # left by a writer that died; rank 0 is the only writer
        stale.unlink(missing_ok=True)
    found = list_checkpoints(directory)
    for _, path in found[: max(0, len(found) - keep_last)] if keep_last else []:
        path.unlink(missing_ok=True)
        _sidecar(path).unlink(missing_ok=True)
        removed.append(path)
    return removed


def set_aside(directory: Path) -> Path | None:
    """Move existing checkpoints into superseded-<time>/ (resume=never), so `auto` never mixes two runs."""
    found = list_checkpoints(directory)
    if not found:
        return None
    target = directory / time.strftime("superseded-%Y%m%dT%H%M%S")
    target.mkdir(exist_ok=True)
    for _, path in found:
        shutil.move(path, target / path.name)
        if _sidecar(path).exists():
            shutil.move(_sidecar(path), target / _sidecar(path).name)
    return target


def choose_resume(resume: str, directory: Path | None, warn: Callable[[str], None]) -> tuple[Path, dict] | None:
    """Rank 0: the checkpoint to continue from, loaded, or None to start fresh.

    auto: the newest valid one in directory (damaged ones are skipped with a warning); never: none;
    anything else is the path of one checkpoint, which must be valid.
    """
    if resume == "never" or (resume == "auto" and directory is None):
        return None
    if resume != "auto":
        path = Path(resume)
        return path, load_checkpoint(path)
    for step, path in reversed(list_checkpoints(directory)):  # type: ignore[arg-type]
        try:
            return path, load_checkpoint(path)
        except CheckpointError as exc:
            warn(f"skipping checkpoint of step {step}: {exc}")
    return None


class Writer:
    """Rank 0's checkpoint writes: atomic_save, then keep-last pruning, in the caller's thread or in the background.

    At most one background write is in flight: save() first waits for the one before. A background write that
    failed raises CheckpointError from the next save(), poll() or wait(): the run stops instead of training on
    without the checkpoints it believes it has. `finished` collects one record per completed write (the caller's
    dict, plus bytes and ckpt_write_s) for the caller to log.
    """

    def __init__(self, keep_last: int, background: bool) -> None:
        self.keep_last, self.background = keep_last, background
        self.finished: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._failure: tuple[Path, BaseException] | None = None

    def save(self, state: dict[str, Any], path: Path, record: dict[str, Any]) -> None:
        """Write state to path. In the background, state must not change until the write ends: a to_cpu copy."""
        self.wait()
        if not self.background:
            self._write(state, path, record)
            return
        self._thread = threading.Thread(
            target=self._write_catching, args=(state, path, record), name="checkpoint-writer", daemon=True
        )
        self._thread.start()

    def poll(self) -> None:
        """Without blocking: reap a background write that has ended (raising if it failed)."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def wait(self) -> None:
        """Until no write is in flight; raises CheckpointError if the last one failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            (path, exc), self._failure = self._failure, None
            raise CheckpointError(f"background write of {path} failed: {type(exc).__name__}: {exc}") from exc

    def _write(self, state: dict[str, Any], path: Path, record: dict[str, Any]) -> None:
        start = time.perf_counter()
        atomic_save(state, path)  # looked up at call time: the fault tests replace it
        prune(path.parent, self.keep_last)  # only now: the new file is complete before old ones go
        record |= {"bytes": path.stat().st_size, "ckpt_write_s": round(time.perf_counter() - start, 6)}
        self.finished.append(record)

    def _write_catching(self, state: dict[str, Any], path: Path, record: dict[str, Any]) -> None:
        try:
            self._write(state, path, record)
        except BaseException as exc:  # handed to the training thread, which raises it
            self._failure = (path, exc)


# ------------------------------------------------------------------------------------------------ state


def to_cpu(obj: Any) -> Any:
    """obj with every tensor copied to CPU memory and every container rebuilt: a snapshot that training, which
    goes on changing the live tensors (optimizer steps are in place), cannot alter while it is being written."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        copy = type(obj)((key, to_cpu(value)) for key, value in obj.items())  # an OrderedDict stays one
        if hasattr(obj, "_metadata"):  # module versions in a state_dict, which load_state_dict reads
            copy._metadata = to_cpu(obj._metadata)  # type: ignore[attr-defined]
        return copy
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(value) for value in obj)
    return obj  # numbers, strings, None: immutable


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
            "name": str(name),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def optimizer_state(optimizer: torch.optim.Optimizer, rank: int) -> dict[str, Any] | None:
    """The full optimizer state on rank 0 (collective for ZeRO: consolidated to rank 0 first)."""
    if hasattr(optimizer, "consolidate_state_dict"):  # ZeroRedundancyOptimizer (not imported: slow import)
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if rank == 0 else None


def build_state(
    *,
    step: int,
    model: nn.Module,
    optimizer_sd: dict[str, Any],
    scaler: torch.amp.GradScaler,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_state: dict[str, int],
    rng_states: list[dict[str, Any]],
    config: dict[str, Any],
    world_size: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "step": step,
        "world_size": world_size,
        "model": model.state_dict(),
        "optimizer": optimizer_sd,
        "scaler": scaler.state_dict(),
        "scheduler": scheduler.state_dict(),
        "data": data_state,
        "rng": rng_states,  # one per rank
        "config": config,
        "extra": extra or {},
    }
