"""Rank 0's metrics: one JSON line per step, a closing summary.json, optional TensorBoard, comm timing.

metrics.jsonl: one object per optimizer step of the model being trained (a resumed run continues the file
after the checkpoint's step; a fresh start empties it):
  step, epoch, loss, accuracy, lr, samples_per_s, step_time_s, comm_time_s, peak_mem_bytes, time
  (+ tokens_per_s for language models, eval_loss and eval_accuracy on steps that evaluated); loss and
  accuracy are over all ranks' samples.
checkpoints.jsonl: one object per checkpoint written, once its file is complete (same lineage rule as
  metrics.jsonl; separate so that every metrics line stays a step): step, path, bytes, async (staged save),
  ckpt_block_s (seconds training stood still for it on rank 0: the collectives, the CPU copy, waiting for the
  previous write still in flight, and with async false, or for the final checkpoint, the write itself),
  ckpt_write_s (serialise, fsync, rename, prune: in the background with async), time.
summary.json, written at the end (also when stopped or failed): status (completed|terminated|failed), steps,
  first_step, last_step, target_step, first_loss, final_loss, eval_loss, eval_accuracy, mean_samples_per_s
  (first step excluded as warm-up), global_batch, world_size, backend, device, model, dataset, wall_time_s
  (seconds in the training loop, final checkpoint included), resumed_from_step (null on a fresh start),
  checkpoints_written, checkpoint_block_s_total, checkpoint_write_s_total (stall fraction = block total /
  wall_time_s), checkpoint_async, and `ddp`: the DDP options and comm hook in effect, read back from the
  DDP object (components.ddp_in_effect).
comm_time_s: wall time during which at least one DDP gradient allreduce was in flight in that step, measured
  by wrapping the comm hook (gloo); null on nccl, where the hook's future completes before the GPU work does.
peak_mem_bytes: CUDA max_memory_allocated for the step on GPU; on CPU the process's peak RSS so far.
"""

import json
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


class CommTimer:
    """Wraps a DDP comm hook and measures the wall time with any allreduce in flight (union of intervals)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []

    def wrap(self, hook: Hook, serialize: bool = False) -> Hook:
        """The hook, timed; serialize: wait for each bucket's communication before DDP launches the next."""

        # DDP checks these two annotations by identity, hence no `from __future__ import annotations` here.
        def timed(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            start = time.perf_counter()

            def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                with self._lock:
                    self._intervals.append((start, time.perf_counter()))
                return fut.value()

            fut = hook(state, bucket)
            if serialize:
                fut.wait()
            return fut.then(done)

        timed.__wrapped__ = hook  # type: ignore[attr-defined]  # inspect.unwrap: which hook is in effect
        return timed

    def take(self) -> float:
        """Seconds with comm in flight since the last call."""
        with self._lock:
            intervals, self._intervals = sorted(self._intervals), []
        total, end = 0.0, float("-inf")
        for start, stop in intervals:
            if stop > end:
                total += stop - max(start, end)
                end = stop
        return total


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return int(peak)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@dataclass
class RunStats:
    """What summary.json reports about this invocation."""

    resumed_from_step: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    samples: int = 0  # after the first step (warm-up excluded from throughput)
    seconds: float = 0.0
    eval: dict[str, float] = field(default_factory=dict)
    checkpoints: int = 0  # written completely
    checkpoint_block_s: float = 0.0
    checkpoint_write_s: float = 0.0

    def add(self, step: int, loss: float, samples: int, seconds: float) -> None:
        if self.first_step is None:
            self.first_step, self.first_loss = step, loss
        elif self.last_step is not None:
            self.samples += samples
            self.seconds += seconds
        self.last_step, self.final_loss = step, loss

    @property
    def mean_samples_per_s(self) -> float | None:
        return round(self.samples / self.seconds, 2) if self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        steps = self.last_step - self.first_step + 1 if self.first_step is not None and self.last_step else 0
        return {
            "steps": steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "first_loss": self.first_loss,
            "final_loss": self.final_loss,
            **self.eval,
            "mean_samples_per_s": self.mean_samples_per_s,
            "resumed_from_step": self.resumed_from_step,
            "checkpoints_written": self.checkpoints,
            "checkpoint_block_s_total": round(self.checkpoint_block_s, 6),
            "checkpoint_write_s_total": round(self.checkpoint_write_s, 6),
        }


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (a crash mid-write) is dropped."""
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _open_lineage(path: Path, resumed_from: int | None) -> IO[str]:
    """path for appending, keeping only the lines up to the step resumed from (none on a fresh start)."""
    kept = [r for r in _read_jsonl(path) if resumed_from is not None and r.get("step", 0) <= resumed_from]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
    return path.open("a", buffering=1)


class MetricsLog:
    """metrics.jsonl, checkpoints.jsonl, summary.json and TensorBoard on rank 0; does nothing on the other ranks."""

    def __init__(self, out_dir: Path, enabled: bool, tensorboard: bool, warn: Callable[[str], None]) -> None:
        self.out_dir, self.enabled, self.tensorboard, self.warn = out_dir, enabled, tensorboard, warn
        self._file: IO[str] | None = None
        self._checkpoints: IO[str] | None = None
        self._tb: Any = None

    def open(self, resumed_from: int | None) -> None:
        """Start logging. metrics.jsonl keeps one line per step of the model being trained: a fresh start
        empties it, a resume keeps the lines up to the checkpoint's step (dropping those of a crashed attempt).
        checkpoints.jsonl follows the same rule."""
        if not self.enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._file = _open_lineage(self.out_dir / "metrics.jsonl", resumed_from)
        self._checkpoints = _open_lineage(self.out_dir / "checkpoints.jsonl", resumed_from)
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                self.warn(f"metrics.tensorboard=true but TensorBoard is unavailable ({exc}); logging JSONL only")
            else:
                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))

    def step(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, record["step"])

    def checkpoint(self, record: dict[str, Any]) -> None:
        if self._checkpoints is not None:
            self._checkpoints.write(json.dumps(record) + "\n")

    def summary(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        tmp = self.out_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(self.out_dir / "summary.json")

    def close(self) -> None:
        for file in (self._file, self._checkpoints):
            if file is not None:
                file.close()
        self._file = self._checkpoints = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def progress_line(record: dict[str, Any], target_step: int) -> str:
    parts = [f"step {record['step']}/{target_step}", f"epoch {record['epoch']}", f"loss {record['loss']:.4f}"]
    parts.append(f"acc {record['accuracy']:.3f}")
    parts.append(f"{record['samples_per_s']:.0f} samples/s")
    parts.append(f"lr {record['lr']:.3g}")
    if record.get("comm_time_s") is not None:
        parts.append(f"comm {1000 * record['comm_time_s']:.1f} ms")
    if "eval_accuracy" in record:
        parts.append(f"eval loss {record['eval_loss']:.4f} acc {record['eval_accuracy']:.3f}")
    return " | ".join(parts)
