"""From config to the objects the loop drives: the DDP-wrapped model with its comm hook, the optimizer
(optionally ZeroRedundancyOptimizer), the LR schedule, autocast and the GradScaler."""

from __future__ import annotations

import inspect
import math
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import Config, OptimConfig, PrecisionConfig
from .distributed import DistInfo
from .metrics import CommTimer

# Newer torch renames broadcast_buffers (buffers from rank 0 before every forward) to forward_sync_buffers.
SYNC_BUFFERS = next(
    name for name in ("forward_sync_buffers", "broadcast_buffers") if name in inspect.signature(DDP).parameters
)
HOOKS = {
    "none": default_hooks.allreduce_hook,  # what DDP does by itself; registered only to time it
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
    "powersgd": powerSGD_hook.powerSGD_hook,
}


def wrap_ddp(model: nn.Module, cfg: Config, info: DistInfo) -> tuple[DDP, CommTimer | None]:
    """Move to the device, wrap in DDP with the configured options, register the comm hook.

    Returns the timer that measures comm time when it is meaningful (gloo with metrics.measure_comm).
    """
    opts = cfg.ddp
    ddp = DDP(
        model.to(info.device),
        device_ids=[info.device.index] if info.device.type == "cuda" else None,
        bucket_cap_mb=opts.bucket_cap_mb,
        gradient_as_bucket_view=opts.gradient_as_bucket_view,
        static_graph=opts.static_graph,
        find_unused_parameters=opts.find_unused_parameters,
        **{SYNC_BUFFERS: opts.broadcast_buffers},
    )
    measure = cfg.metrics.measure_comm and info.backend == "gloo"
    if opts.comm_hook == "none" and not measure:
        return ddp, None  # DDP's built-in allreduce
    state: Any = None  # the default process group
    if opts.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=opts.powersgd_rank,
            start_powerSGD_iter=opts.powersgd_start_iter,
            random_seed=cfg.run.seed,
        )
    # Always through the timer's wrapper: it also lets bf16 compression run on gloo, which supports bf16
    # allreduce although DDP's name check for bf16_compress_hook only knows NCCL.
    # PowerSGD waits on collectives inside future callbacks. On gloo those callbacks run on the process group's
    # few worker threads, so several buckets in flight deadlock (or issue collectives in a different order on
    # different ranks): there the hook runs one bucket at a time, without overlapping the backward pass.
    serialize = opts.comm_hook == "powersgd" and info.backend == "gloo"
    timer = CommTimer()
    ddp.register_comm_hook(state, timer.wrap(HOOKS[opts.comm_hook], serialize=serialize))
    return ddp, timer if measure else None


def ddp_in_effect(ddp: DDP, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """What DDP, the optimizer and the scaler actually do, read back from the objects rather than the config: a
    summary that can tell when a configured option or hook never reached DDP."""
    hooks = getattr(ddp, "_comm_hooks", None)  # [(hook, state)]; private, hence the guard
    hook, state = hooks[-1] if hooks else (None, None)
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
    effect = {
        "comm_hook": inspect.unwrap(hook).__name__ if hook else None,  # None: DDP's built-in allreduce
        "comm_hook_timed": hook is not None and hasattr(hook, "__wrapped__"),
        "static_graph": bool(ddp.static_graph),
        "bucket_cap_mb": round(ddp.bucket_bytes_cap / 2**20, 4),  # DDP keeps whole bytes
        "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
        "find_unused_parameters": bool(ddp.find_unused_parameters),
        "broadcast_buffers": bool(getattr(ddp, SYNC_BUFFERS)),
        "zero": inner is not None,
        "optimizer": type(inner or optimizer).__name__,
        "activation_checkpointing": bool(getattr(ddp.module, "checkpointing", False)),
        "grad_scaler": scaler.is_enabled(),
    }
    if isinstance(state, powerSGD_hook.PowerSGDState):
        effect |= {"powersgd_rank": state.matrix_approximation_rank, "powersgd_start_iter": state.start_powerSGD_iter}
    return effect


def effective_lr(cfg: OptimConfig, global_batch: int) -> float:
    """lr, or lr * global_batch / base_batch_size with optim.lr_scaling=linear."""
    return cfg.lr * global_batch / cfg.base_batch_size if cfg.lr_scaling == "linear" else cfg.lr


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    cls: type[torch.optim.Optimizer]
    if cfg.name == "sgd":
        cls, kwargs = torch.optim.SGD, {"momentum": cfg.momentum}
    else:
        cls, kwargs = torch.optim.AdamW, {"betas": cfg.betas}
    kwargs |= {"lr": lr, "weight_decay": cfg.weight_decay}
    if cfg.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # a slow import, only when wanted

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)
    return cls(model.parameters(), **kwargs)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over warmup_steps, then constant or cosine down to min_lr_ratio at decay_steps."""
    horizon = cfg.decay_steps or max_steps

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, horizon - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_scaler(cfg: PrecisionConfig, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active for fp16 only (a pass-through otherwise)."""
    return torch.amp.GradScaler(
        device.type,
        init_scale=cfg.init_scale,
        growth_interval=cfg.growth_interval,
        enabled=cfg.mode == "fp16",
    )


def autocast(cfg: PrecisionConfig, device: torch.device) -> AbstractContextManager[Any]:
    dtype = torch.bfloat16 if cfg.mode == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=cfg.mode != "off")
