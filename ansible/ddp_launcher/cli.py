"""The `ddp` command: one subcommand per thing a user does with the cluster, each with its own --help.

    ddp train [--inventory inventory/local] [--program x.py --args '...'] ...
    ddp status|logs|stop|report [--run ID] ...
    ddp runs
    ddp envs [--prune-days N]
    ddp doctor|bench [--inventory inventory/local]

The make targets of the same names call it; it works the same without make, from the repository's .venv.
"""

from __future__ import annotations

import importlib
import sys

from . import control

# command: (module, what it does). Modules load only when their command runs: `ddp status` need not pay for
# the report's plotting library.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "launch a run on the inventory's training nodes and follow it to the end"),
    **{action: ("control", text) for action, text in control.ACTIONS.items()},
    "envs": ("envs", "the job environments on shared storage (size, last use, runs); --prune-days N removes old ones"),
    "doctor": ("doctor", "is this cluster fit to train? versions, interfaces, links, allreduce, known log failures"),
    "bench": ("bench", "the figures of merit, each a ratio of two numbers measured in one run -> bench.json"),
}


def usage() -> str:
    lines = ["usage: ddp COMMAND [options]   (ddp COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"ddp: unknown command '{command}'\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__package__}.{COMMANDS[command][0]}")
    if module is control:
        return control.main([command, *rest])
    return module.main(rest, prog=f"ddp {command}")
