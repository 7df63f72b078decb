"""The training program's entry: arguments, config, the process group, the run (train/train.py and
`python -m ddp_train` call main, then exit_with). Usage: train/train.py's docstring."""

from __future__ import annotations

import os
import random
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from . import checkpoint as ckpt
from .cli import config_from_args, parse_args, print_config
from .components import (
    build_optimizer,
    build_scaler,
    build_scheduler,
    ddp_in_effect,
    effective_lr,
    wrap_ddp,
)
from .config import TOKEN_DATASETS, Config, ConfigError
from .data import build_datasets, build_eval_loader, build_stream
from .distributed import (
    DistInfo,
    Terminated,
    all_gather_object,
    broadcast_object,
    env_ranks,
    install_signal_handlers,
    print0,
    print_all,
    process_group,
    resolve_backend,
    resolve_device,
    warn0,
)
from .loop import Trainer, reap_checkpoints, train
from .metrics import MetricsLog
from .models import build_model
from .progress import Progress


def preflight(cfg: Config) -> None:
    """Checks that need the machine but no other process: fail here, on every rank, rather than in a collective."""
    try:
        backend = resolve_backend(cfg.dist.backend)
        device = resolve_device(backend, env_ranks()[2])
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from exc
    if cfg.precision.mode == "fp16" and device.type != "cuda":
        raise ConfigError("precision.mode=fp16 uses torch.amp.GradScaler and needs CUDA; use bf16 or off on CPU")
    if cfg.data.dataset in ("folder", "text") and not Path(str(cfg.data.root)).exists():
        raise ConfigError(f"data.root={cfg.data.root} does not exist")
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).is_file():
        raise ConfigError(f"checkpoint.resume={resume}: no such checkpoint file")


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resume_state(cfg: Config, info: DistInfo, ckpt_dir: Path | None) -> dict | None:
    """Rank 0 chooses (newest valid, damaged ones skipped) and broadcasts the path; the others load it."""
    choice: tuple[str | None, str | None] = (None, None)  # (path, error)
    state = None
    if info.is_main:
        try:
            if cfg.checkpoint.resume == "never" and ckpt_dir is not None and (moved := ckpt.set_aside(ckpt_dir)):
                warn0(f"resume=never: earlier checkpoints moved to {moved}")
            found = ckpt.choose_resume(cfg.checkpoint.resume, ckpt_dir, warn0)
            if found:
                choice, state = (str(found[0]), None), found[1]
        except Exception as exc:  # told to every rank below, so that none waits in the broadcast
            choice = (None, str(exc) if isinstance(exc, ckpt.CheckpointError) else f"{type(exc).__name__}: {exc}")
    path, error = broadcast_object(choice)
    if error:
        raise ckpt.CheckpointError(error)
    if path and not info.is_main:
        state = ckpt.load_checkpoint(Path(path), verify=False)
    if path:
        print0(f"resuming from {path} (step {state['step']})")  # type: ignore[index]
    return state


def restore(state: dict, t: Trainer) -> None:
    """Optimizer, schedule, scaler, data position and RNG streams from a checkpoint (the model is loaded earlier)."""
    t.step = int(state["step"])
    t.optimizer.load_state_dict(state["optimizer"])
    t.scheduler.load_state_dict(state["scheduler"])
    t.scaler.load_state_dict(state["scaler"])
    t.stream.restore(state["data"], t.info.world_size)
    if len(state["rng"]) == t.info.world_size:
        ckpt.set_rng_state(state["rng"][t.info.rank])
    else:
        warn0(f"checkpoint from {len(state['rng'])} ranks, now {t.info.world_size}: RNG streams re-seeded")
    t.stats.resumed_from_step = t.saved_step = t.step


def target_step(cfg: Config, step: int, state: dict | None, run_id: str | None) -> int:
    """The step to train to: run.max_steps, or with run.steps that many on top of the checkpoint resumed from.

    A torchrun restart (--max-restarts) of the same invocation resumes from a checkpoint that invocation wrote
    (same TORCHELASTIC_RUN_ID): it keeps the invocation's original target instead of moving it further.
    """
    if not cfg.run.steps:
        return cfg.run.max_steps
    saved = (state or {}).get("extra", {})
    if run_id and run_id != "none" and saved.get("run_id") == run_id and "target_step" in saved:
        return int(saved["target_step"])
    return step + cfg.run.steps


def run(cfg: Config, info: DistInfo) -> None:
    seed = cfg.run.seed
    seed_all(seed)  # same model initialisation everywhere (DDP also broadcasts rank 0's)
    train_set, eval_set, data_info = build_datasets(cfg.data, seed)
    model = build_model(cfg.model, data_info)
    seed_all(seed + info.rank)  # per-rank streams (dropout)

    ckpt_dir = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
    if ckpt_dir is None:
        warn0("no checkpoint.dir (--checkpoint-dir): no checkpoints are written and nothing is resumed")
    out_dir = Path(cfg.metrics.output_dir or cfg.checkpoint.dir or "runs/train")
    state = resume_state(cfg, info, ckpt_dir)
    if state:
        model.load_state_dict(state["model"])

    ddp, comm = wrap_ddp(model, cfg, info)
    global_batch = cfg.data.batch_size * cfg.run.grad_accum_steps * info.world_size
    lr = effective_lr(cfg.optim, global_batch)
    optimizer = build_optimizer(ddp, cfg.optim, lr)
    t = Trainer(
        cfg,
        info,
        model=ddp,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.optim, cfg.run.max_steps),
        scaler=build_scaler(cfg.precision, info.device),
        stream=build_stream(
            train_set, cfg.data, info.rank, info.world_size, seed=seed, cuda=info.device.type == "cuda"
        ),
        eval_loader=build_eval_loader(eval_set, cfg.data, info.rank, info.world_size) if eval_set else None,
        log=MetricsLog(out_dir, info.is_main, cfg.metrics.tensorboard, warn0),
        comm=comm,
        ckpt_dir=ckpt_dir,
        target_step=cfg.run.max_steps,
        writer=ckpt.Writer(cfg.checkpoint.keep_last, cfg.checkpoint.async_) if ckpt_dir and info.is_main else None,
        tokens_per_sample=cfg.data.seq_len if cfg.data.dataset in TOKEN_DATASETS else 0,
        rank_nodes=all_gather_object(socket.gethostname()),
        progress=Progress.from_env(info.rank),
    )
    if state:
        restore(state, t)
    t.target_step = target_step(cfg, t.step, state, os.environ.get("TORCHELASTIC_RUN_ID"))
    t.log.open(t.stats.resumed_from_step)
    print0(
        f"world {info.world_size} | backend {info.backend} | device {info.device.type} | {cfg.model.name} "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params | {cfg.data.dataset} | "
        f"global batch {global_batch} | lr {lr:.4g} | precision {cfg.precision.mode} | "
        f"comm hook {cfg.ddp.comm_hook} | steps {t.step}->{t.target_step} | out {out_dir}"
    )
    status, started = "failed", time.time()
    try:
        if t.step >= t.target_step:
            print0(f"already at step {t.step} >= {t.target_step}: nothing to train")
        train(t)
        status = "completed"
    except Terminated:
        status = "terminated"
        raise
    finally:
        if status != "completed":
            finish_writing(t)
        t.log.summary(
            t.stats.as_dict()
            | {"status": status, "target_step": t.target_step, "global_batch": global_batch}
            | {"world_size": info.world_size, "backend": info.backend, "device": info.device.type}
            | {"model": cfg.model.name, "dataset": cfg.data.dataset, "wall_time_s": round(time.time() - started, 3)}
            | {"checkpoint_async": cfg.checkpoint.async_, "ddp": ddp_in_effect(ddp, optimizer, t.scaler)}
        )
        t.log.close()


def finish_writing(t: Trainer) -> None:
    """A stopped or failed run still completes a checkpoint write in flight: its state is whole and consistent."""
    try:
        reap_checkpoints(t, wait=True)
    except ckpt.CheckpointError as exc:
        warn0(str(exc))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.print_config:
            return print_config(args)
        cfg = config_from_args(args)
        preflight(cfg)
    except ConfigError as exc:
        print_all(f"config error: {exc}")
        return 2
    install_signal_handlers()
    try:
        with process_group(cfg.dist.backend, cfg.dist.timeout_s) as info:
            run(cfg, info)
    except Terminated as exc:
        print_all(f"stopping: {exc}; process group destroyed")
        return 128 + exc.signum
    except Exception:
        print_all(f"failed:\n{traceback.format_exc()}")
        return 1
    return 0


def exit_with(code: int) -> NoReturn:
    """Leave without the interpreter's finalization: gloo's worker threads can still hold work objects whose
    tensors need the GIL then, and tearing them down aborts a run that succeeded (SIGABRT after "terminate called
    without an active exception", pytorch/pytorch#179291: seen here once in a few hundred runs). Everything this
    program writes is closed, and every checkpoint fsynced, by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
