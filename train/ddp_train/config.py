"""Typed training configuration: YAML in, validated dataclasses out.

Every knob the program has lives here. `load_config(path, overrides)` reads the YAML file, applies
`section.key=value` overrides (values parsed as YAML), and refuses unknown keys, wrong types and bad values
with a `ConfigError` naming the key. It runs identically on every rank before any process group exists, so a
mistake stops every process at start-up instead of hanging a collective.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

Dataset = Literal["synthetic", "digits", "folder", "synthetic_tokens", "text"]
IMAGE_DATASETS = ("synthetic", "digits", "folder")
TOKEN_DATASETS = ("synthetic_tokens", "text")


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who wrote the YAML."""


@dataclass
class RunConfig:
    seed: int = 0
    max_steps: int = 100  # optimizer steps in total (the target a resumed run continues towards)
    steps: int | None = None  # when set: train this many steps on top of the checkpoint resumed from
    grad_accum_steps: int = 1  # micro-batches per optimizer step (model.no_sync() on all but the last)
    log_every: int = 10  # progress line on rank 0 every N steps (metrics.jsonl gets every step)
    eval_every: int = 0  # evaluate every N steps; 0 = only at the end; needs an eval split
    eval_batches: int = 0  # cap on eval batches per rank; 0 = the whole eval split


@dataclass
class DistConfig:
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto: nccl when CUDA is available, else gloo
    timeout_s: float = 600.0  # collective timeout


@dataclass
class DataConfig:
    dataset: Dataset = "digits"
    root: str | None = None  # folder: <root>/<class>/*.npy|*.pt; text: a file read as bytes
    batch_size: int = 32  # per process and micro-step
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    eval_fraction: float = 0.2  # digits/folder: held-out share; synthetic*: eval size relative to train
    num_samples: int = 4096  # synthetic, synthetic_tokens: training-set size
    num_classes: int = 10  # synthetic
    image_size: int = 32  # synthetic: square images
    channels: int = 3  # synthetic
    seq_len: int = 64  # token datasets
    vocab_size: int = 256  # synthetic_tokens (text is always 256: bytes)


@dataclass
class ModelConfig:
    name: Literal["small_cnn", "resnet50", "transformer_lm"] = "small_cnn"
    width: int = 32  # small_cnn: channels of the first stage (doubled per stage)
    blocks_per_stage: int = 1  # small_cnn: residual blocks in each of its 2 stages
    norm: Literal["batch", "group"] = "batch"  # small_cnn normalisation (group: batch-size independent)
    d_model: int = 128  # transformer_lm
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.0
    activation_checkpointing: bool = False  # torch.utils.checkpoint around every block


@dataclass
class OptimConfig:
    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.9  # sgd
    betas: tuple[float, float] = (0.9, 0.999)  # adamw
    weight_decay: float = 0.0
    zero: bool = False  # ZeroRedundancyOptimizer: optimizer state sharded across ranks
    lr_scaling: Literal["none", "linear"] = "none"  # linear: lr * global_batch / base_batch_size
    base_batch_size: int = 256
    warmup_steps: int = 0  # linear warm-up from 0
    schedule: Literal["constant", "cosine"] = "constant"
    decay_steps: int | None = None  # cosine horizon; default run.max_steps
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    grad_clip: float = 0.0  # max global grad norm; 0 = off


@dataclass
class DDPConfig:
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    powersgd_rank: int = 1  # matrix_approximation_rank
    powersgd_start_iter: int = 10  # start_powerSGD_iter (plain allreduce before it)


@dataclass
class PrecisionConfig:
    mode: Literal["off", "bf16", "fp16"] = "off"  # fp16 uses torch.amp.GradScaler and needs CUDA
    init_scale: float = 65536.0
    growth_interval: int = 2000


@dataclass
class CheckpointConfig:
    dir: str | None = None  # None: no checkpoints, no resume
    every: int = 50  # save every N steps (and always at the end); 0 = only at the end
    keep_last: int = 3  # keep the newest K; 0 = keep all
    resume: str = "auto"  # auto (newest valid) | never | <path of one checkpoint>
    # YAML key `async` (a Python keyword): true = rank 0 copies the state to CPU memory and a background thread
    # writes it while training goes on; false = every rank waits until the file is written and fsynced.
    async_: bool = field(default=True, metadata={"key": "async"})


@dataclass
class MetricsConfig:
    output_dir: str | None = None  # metrics.jsonl, summary.json; default: checkpoint.dir, else runs/train
    tensorboard: bool = False  # only if torch.utils.tensorboard imports (warns otherwise)
    measure_comm: bool = True  # time DDP's allreduce through a comm hook (gloo; null on nccl)


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


def _key(f: dataclasses.Field) -> str:
    """The YAML name of a field: its name, unless metadata says otherwise (a Python keyword such as `async`)."""
    return f.metadata.get("key", f.name)


def _as_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {_key(f): _as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


# ---------------------------------------------------------------------------------------------- parsing


# type -> (accepts the YAML value, what to call it in an error); bool is not an int here, int is a float.
SCALARS: dict[type, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _convert(value: Any, hint: Any, where: str) -> Any:
    """Check (and lightly coerce) one YAML value against a type hint."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], where)
    if origin is Literal:
        if value is False and "off" in args:  # YAML 1.1 reads a bare `off` as false
            value = "off"
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    accepts, what = SCALARS[hint]
    if not accepts(value):
        raise ConfigError(f"{where}: expected {what}, got {value!r}")
    return float(value) if hint is float else value


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {_key(f): f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else f" (known: {', '.join(fields)})"
            raise ConfigError(f"unknown key '{where + '.' if where else ''}{key}'{hint}")
    kwargs = {}
    for yaml_key, name in fields.items():
        if yaml_key not in data:
            continue
        key = f"{where}.{yaml_key}" if where else yaml_key
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, data[yaml_key], key)
        else:
            kwargs[name] = _convert(data[yaml_key], hint, key)
    return cls(**kwargs)


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `section.key=value` (value parsed as YAML) to the raw mapping."""
    path, sep, text = override.partition("=")
    if not sep or not path.strip():
        raise ConfigError(f"override {override!r}: expected section.key=value")
    keys = path.strip().split(".")
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: '{key}' is not a section")
        node = child
    try:
        node[keys[-1]] = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML ({exc})") from exc


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: Config) -> Config:
    """Value checks, section by section, then across sections."""
    run, data, model, optim = cfg.run, cfg.data, cfg.model, cfg.optim
    _require(run.max_steps >= 1, f"run.max_steps must be >= 1, got {run.max_steps}")
    _require(run.steps is None or run.steps >= 1, f"run.steps must be >= 1 when set, got {run.steps}")
    _require(run.seed >= 0, f"run.seed must be >= 0, got {run.seed}")
    for key in ("grad_accum_steps", "log_every"):
        _require(getattr(run, key) >= 1, f"run.{key} must be >= 1, got {getattr(run, key)}")
    for key in ("eval_every", "eval_batches"):
        _require(getattr(run, key) >= 0, f"run.{key} must be >= 0, got {getattr(run, key)}")
    _require(cfg.dist.timeout_s > 0, f"dist.timeout_s must be > 0, got {cfg.dist.timeout_s}")

    for key in ("batch_size", "num_samples", "num_classes", "image_size", "channels"):
        _require(getattr(data, key) >= 1, f"data.{key} must be >= 1, got {getattr(data, key)}")
    _require(data.num_workers >= 0, f"data.num_workers must be >= 0, got {data.num_workers}")
    _require(
        not data.persistent_workers or data.num_workers > 0,
        "data.persistent_workers=true needs data.num_workers > 0",
    )
    _require(0.0 <= data.eval_fraction < 1.0, f"data.eval_fraction must be in [0, 1), got {data.eval_fraction}")
    _require(data.seq_len >= 2, f"data.seq_len must be >= 2, got {data.seq_len}")
    _require(2 <= data.vocab_size <= 1 << 20, f"data.vocab_size must be in [2, 2^20], got {data.vocab_size}")
    _require(data.num_classes >= 2, f"data.num_classes must be >= 2, got {data.num_classes}")
    if data.dataset in ("folder", "text"):
        _require(bool(data.root), f"data.root is required for data.dataset={data.dataset}")

    for key in ("width", "blocks_per_stage", "d_model", "n_heads", "n_layers", "d_ff"):
        _require(getattr(model, key) >= 1, f"model.{key} must be >= 1, got {getattr(model, key)}")
    _require(
        model.d_model % model.n_heads == 0,
        f"model.d_model ({model.d_model}) must be divisible by model.n_heads ({model.n_heads})",
    )
    _require(0.0 <= model.dropout < 1.0, f"model.dropout must be in [0, 1), got {model.dropout}")
    wants_tokens = model.name == "transformer_lm"
    _require(
        wants_tokens == (data.dataset in TOKEN_DATASETS),
        f"model.name={model.name} does not fit data.dataset={data.dataset} "
        f"(transformer_lm takes {' or '.join(TOKEN_DATASETS)}; the CNNs take {', '.join(IMAGE_DATASETS)})",
    )

    _require(optim.lr > 0, f"optim.lr must be > 0, got {optim.lr}")
    _require(0.0 <= optim.momentum < 1.0, f"optim.momentum must be in [0, 1), got {optim.momentum}")
    _require(all(0.0 <= b < 1.0 for b in optim.betas), f"optim.betas must be in [0, 1), got {list(optim.betas)}")
    for key in ("weight_decay", "warmup_steps", "grad_clip", "min_lr_ratio"):
        _require(getattr(optim, key) >= 0, f"optim.{key} must be >= 0, got {getattr(optim, key)}")
    _require(optim.min_lr_ratio <= 1.0, f"optim.min_lr_ratio must be <= 1, got {optim.min_lr_ratio}")
    _require(optim.base_batch_size >= 1, f"optim.base_batch_size must be >= 1, got {optim.base_batch_size}")
    _require(
        optim.decay_steps is None or optim.decay_steps >= 1,
        f"optim.decay_steps must be >= 1 when set, got {optim.decay_steps}",
    )

    ddp = cfg.ddp
    _require(ddp.bucket_cap_mb > 0, f"ddp.bucket_cap_mb must be > 0, got {ddp.bucket_cap_mb}")
    _require(ddp.powersgd_rank >= 1, f"ddp.powersgd_rank must be >= 1, got {ddp.powersgd_rank}")
    _require(
        ddp.powersgd_start_iter >= 2,
        f"ddp.powersgd_start_iter must be >= 2 (PowerSGD with error feedback starts after DDP's first "
        f"iterations), got {ddp.powersgd_start_iter}",
    )
    prec = cfg.precision
    _require(prec.init_scale > 0, f"precision.init_scale must be > 0, got {prec.init_scale}")
    _require(prec.growth_interval >= 1, f"precision.growth_interval must be >= 1, got {prec.growth_interval}")

    ckpt = cfg.checkpoint
    _require(ckpt.every >= 0, f"checkpoint.every must be >= 0, got {ckpt.every}")
    _require(ckpt.keep_last >= 0, f"checkpoint.keep_last must be >= 0, got {ckpt.keep_last}")
    _require(bool(ckpt.resume), "checkpoint.resume must be auto, never or a checkpoint path")
    return cfg


def config_from_dict(raw: dict[str, Any]) -> Config:
    return validate(_build(Config, raw, ""))


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or start from the defaults when path is None), apply overrides, validate."""
    raw: Any = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist")
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {file}: expected a mapping of sections at the top level")
    for override in overrides:
        apply_override(raw, override)
    return config_from_dict(raw)
