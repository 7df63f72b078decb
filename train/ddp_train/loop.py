"""The training loop: micro-batches with no_sync, the optimizer step, metrics, eval, checkpoints."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from . import checkpoint as ckpt
from .components import autocast
from .config import Config
from .data import BatchStream
from .distributed import DistInfo, all_gather_object, barrier, print0
from .metrics import CommTimer, MetricsLog, RunStats, peak_memory_bytes, progress_line
from .models import loss_and_correct
from .progress import Progress


@dataclass
class Trainer:
    cfg: Config
    info: DistInfo
    model: DDP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    stream: BatchStream
    eval_loader: DataLoader | None
    log: MetricsLog
    comm: CommTimer | None
    ckpt_dir: Path | None
    target_step: int
    writer: ckpt.Writer | None = None  # rank 0 with a checkpoint dir
    step: int = 0  # optimizer steps completed
    tokens_per_sample: int = 0  # language models: also report tokens/s
    saved_step: int | None = None
    stats: RunStats = field(default_factory=RunStats)
    rank_nodes: list[str] = field(default_factory=list)  # the host of every rank, by rank
    progress: Progress = field(default_factory=lambda: Progress(None, 0))  # the step reached, for hang checks

    @property
    def global_batch(self) -> int:
        return self.cfg.data.batch_size * self.cfg.run.grad_accum_steps * self.info.world_size


def train(t: Trainer) -> None:
    run = t.cfg.run
    while t.step < t.target_step:
        reap_checkpoints(t)  # a background write that failed stops the run here, at the next step
        start, lr = time.perf_counter(), t.optimizer.param_groups[0]["lr"]
        totals = train_step(t)
        t.step += 1
        record = step_record(t, totals, time.perf_counter() - start, lr)
        if t.eval_loader is not None and (t.step == t.target_step or (run.eval_every and t.step % run.eval_every == 0)):
            record |= evaluate(t)
            t.stats.eval = {k: record[k] for k in ("eval_loss", "eval_accuracy")}
        first = t.stats.first_step is None  # this process's first step (also after a resume)
        logged = first or t.step % run.log_every == 0 or t.step == t.target_step
        if logged:  # every rank reaches this at the same steps: a collective is safe here
            record |= node_times(t, record)
        t.log.step(record)
        t.stats.add(t.step, record["loss"], t.global_batch, record["step_time_s"])
        if logged:
            print0(progress_line(record, t.target_step))
        every = t.cfg.checkpoint.every
        if every and t.step % every == 0 and t.step != t.target_step:
            save_checkpoint(t)
    if t.saved_step != t.step:
        save_checkpoint(t, final=True)
    reap_checkpoints(t)


def train_step(t: Trainer) -> torch.Tensor:
    """One optimizer step over grad_accum_steps micro-batches; gradients sync on the last one only.

    Returns [loss sum over micro-batches, correct, predictions] summed over all ranks.
    """
    accum, device = t.cfg.run.grad_accum_steps, t.info.device
    totals = torch.zeros(3, device=device)
    t.optimizer.zero_grad(set_to_none=True)
    for micro in range(accum):
        x, y = (v.to(device, non_blocking=True) for v in t.stream.next())
        with nullcontext() if micro == accum - 1 else t.model.no_sync():
            with autocast(t.cfg.precision, device):
                loss, correct = loss_and_correct(t.model(x), y)
            if micro == accum - 1:  # the backward pass to come waits for every rank
                t.progress.reached(t.step + 1)
            t.scaler.scale(loss / accum).backward()
        totals += torch.stack([loss.detach().float(), correct.float(), torch.tensor(y.numel(), device=device)])
    if t.cfg.optim.grad_clip:
        t.scaler.unscale_(t.optimizer)
        torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.cfg.optim.grad_clip)
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.scheduler.step()
    dist.all_reduce(totals)
    return totals


def node_times(t: Trainer, record: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each node's slowest rank's step and communication time for this step: a straggler shows as the node whose
    step time stands out, the others' waiting as their communication time. One small all_gather, at log steps."""
    comm = record["comm_time_s"]
    # float64 and unrounded: rank 0's own time comes back exactly as it measured it.
    mine = torch.tensor([record["step_time_s"], -1.0 if comm is None else comm], dtype=torch.float64)
    mine = mine.to(t.info.device)
    every = [torch.zeros_like(mine) for _ in range(t.info.world_size)]
    if dist.is_initialized():
        dist.all_gather(every, mine)
    else:  # plain `python train.py`: one process
        every = [mine]
    step_s: dict[str, float] = {}
    comm_s: dict[str, float | None] = {}
    for node, times in zip(t.rank_nodes or ["?"] * t.info.world_size, every, strict=True):
        step, wait = times.tolist()
        step_s[node] = max(step, step_s.get(node, 0.0))
        comm_s[node] = None if wait < 0 else max(wait, comm_s.get(node) or 0.0)
    return {"node_step_time_s": step_s, "node_comm_time_s": comm_s}


def step_record(t: Trainer, totals: torch.Tensor, seconds: float, lr: float) -> dict[str, Any]:
    loss_sum, correct, count = totals.tolist()
    record = {
        "step": t.step,
        "target_step": t.target_step,  # progress and ETA for whoever reads the newest line (make train/status)
        "epoch": t.stream.epoch,
        "loss": loss_sum / (t.cfg.run.grad_accum_steps * t.info.world_size),
        "accuracy": correct / count,
        "lr": lr,
        "samples_per_s": t.global_batch / seconds,
        "step_time_s": seconds,
        "comm_time_s": t.comm.take() if t.comm else None,
        "peak_mem_bytes": peak_memory_bytes(t.info.device),
        "time": time.time(),
    }
    if t.tokens_per_sample:
        record["tokens_per_s"] = record["samples_per_s"] * t.tokens_per_sample
    return record


@torch.no_grad()
def evaluate(t: Trainer) -> dict[str, float]:
    """Loss and accuracy over the eval split, each rank on its shard of the plain module (no DDP collectives)."""
    module, batches = t.model.module, t.cfg.run.eval_batches
    module.eval()
    totals = torch.zeros(3, device=t.info.device)
    for i, batch in enumerate(t.eval_loader or []):
        if batches and i >= batches:
            break
        x, y = (v.to(t.info.device) for v in batch)
        with autocast(t.cfg.precision, t.info.device):
            loss, correct = loss_and_correct(module(x), y)
        totals += torch.stack([loss.float() * y.numel(), correct.float(), torch.tensor(y.numel(), device=x.device)])
    module.train()
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return {"eval_loss": loss_sum / max(count, 1), "eval_accuracy": correct / max(count, 1)}


def save_checkpoint(t: Trainer, final: bool = False) -> None:
    """Collective: every rank takes part (ZeRO consolidation, RNG gather); rank 0 writes atomically.

    checkpoint.async (staged): rank 0 copies the state to CPU memory and a background thread writes it while
    every rank trains on; the final checkpoint is waited for. Otherwise every rank waits until the file is
    written. The time training stood still is the checkpoint's ckpt_block_s (rank 0's view).
    """
    if t.ckpt_dir is None:
        return
    start, staged = time.perf_counter(), t.cfg.checkpoint.async_
    if not staged:
        barrier(t.info)
    optimizer_sd = ckpt.optimizer_state(t.optimizer, t.info.rank)
    rng_states = all_gather_object(ckpt.rng_state())
    if t.writer is not None:
        state = ckpt.build_state(
            step=t.step,
            model=t.model.module,
            optimizer_sd=optimizer_sd or {},
            scaler=t.scaler,
            scheduler=t.scheduler,
            data_state=t.stream.state(t.info.world_size),
            rng_states=rng_states,
            config=t.cfg.to_dict(),
            world_size=t.info.world_size,
            extra={"run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "target_step": t.target_step},
        )
        path = ckpt.checkpoint_path(t.ckpt_dir, t.step)
        record: dict[str, Any] = {"step": t.step, "path": str(path), "async": staged, "ckpt_block_s": None}
        # The final checkpoint is waited for at once: nothing changes the live state meanwhile, no copy needed.
        t.writer.save(ckpt.to_cpu(state) if staged and not final else state, path, record)
        if final:
            t.writer.wait()
    if not staged:
        barrier(t.info)
    t.saved_step = t.step
    if t.writer is not None:
        block = time.perf_counter() - start
        record["ckpt_block_s"] = round(block, 6)  # before any reap: only this thread logs records
        t.stats.checkpoint_block_s += block


def reap_checkpoints(t: Trainer, wait: bool = False) -> None:
    """Rank 0: log the writes that have completed (checkpoints.jsonl); raise if a background one failed."""
    if t.writer is None:
        return
    try:
        t.writer.wait() if wait else t.writer.poll()
    finally:  # the checkpoints written before a failed one are whole: still logged
        while t.writer.finished:
            record = t.writer.finished.pop(0)
            t.stats.checkpoint_write_s += record["ckpt_write_s"]
            t.stats.checkpoints += 1
            t.log.checkpoint(record | {"time": time.time()})
            print0(f"checkpoint {record['path']}")
