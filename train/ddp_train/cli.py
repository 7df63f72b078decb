"""The program's arguments and config, without torch: `--print-config` (what the launch runs on the master to
check a config before any node starts) answers in the tenth of a second that parsing takes, not in the seconds
that importing torch takes (half a minute on a slow node)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from .config import Config, ConfigError, load_config

# train/, wherever it lives (the repository, /opt/ddp/train in the image): the configs are beside the package.
PROGRAM_DIR = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = PROGRAM_DIR / "configs" / "cpu-smoke.yaml"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP training", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--keep-last", type=int)
    p.add_argument("--resume", help="auto | never | PATH")
    p.add_argument("--output-dir")
    p.add_argument("--seed", type=int)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides")
    p.add_argument("--print-config", action="store_true")
    return p.parse_args(argv)


FLAG_KEYS = {
    "max_steps": "run.max_steps",
    "steps": "run.steps",
    "checkpoint_dir": "checkpoint.dir",
    "checkpoint_every": "checkpoint.every",
    "keep_last": "checkpoint.keep_last",
    "resume": "checkpoint.resume",
    "output_dir": "metrics.output_dir",
    "seed": "run.seed",
}


def config_from_args(args: argparse.Namespace) -> Config:
    # JSON is YAML: "runs/x" stays a string, 100 an integer.
    flags = [
        f"{key}={json.dumps(getattr(args, name))}" for name, key in FLAG_KEYS.items() if getattr(args, name) is not None
    ]
    return load_config(args.config, [*flags, *args.overrides])


def print_config(args: argparse.Namespace) -> int:
    """The resolved config as YAML (rank 0 only, were it run under torchrun), or the config error: exit 0 or 2."""
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") == "0":
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int | None:
    """Answers --print-config without loading the trainer (and torch); None: the trainer must run."""
    args = parse_args(argv)
    return print_config(args) if args.print_config else None
