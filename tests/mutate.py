#!/usr/bin/env python3
"""A small mutation check of the core modules: do their fast unit tests notice when the code is wrong?

For each module below, every mutant (one small change: a comparison flipped, a condition negated, a constant
changed, a call statement removed, ...) is written into a private copy of the repository, the module's fast
tests run there (pytest -x, with a per-mutant timeout), and the mutant counts as killed when they fail.
Survivors are printed as file:line and the change. The working tree is never written: other people can keep
editing while this runs, and an interrupted run (Ctrl-C) leaves nothing behind but its temporary copy, which
is removed too.

    .venv/bin/python tests/mutate.py                                # every module, every mutant
    .venv/bin/python tests/mutate.py --module filters               # the validators and gpu_stack's version filter
    .venv/bin/python tests/mutate.py --module ddp_node --max-mutants 20
    .venv/bin/python tests/mutate.py --module checkpoint --lines 40-90 --list   # show, run nothing

A line holding "pragma: no mutate" is never mutated (for changes no test can or should see).
Exit status: 0 when it ran (survivors are reported, not failed on), 2 when a module's tests fail unmutated.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    path: str  # relative to the repository root
    tests: tuple[str, ...]  # pytest arguments: the fast tests that cover it
    timeout_s: float  # per mutant; at least 5 x the unmutated run's time is used


TARGETS = {
    "validators": Target(
        "ansible/plugins/filter/ddp_validators.py",
        ("tests/unit/test_validators.py", "tests/unit/test_validators_firewall.py"),
        30,
    ),
    "gpu_stack_versions": Target(
        "ansible/roles/gpu_stack/filter_plugins/gpu_stack_versions.py",
        ("tests/unit/test_plugin_gpu_stack_versions.py",),
        30,
    ),
    # In process where it can, as a process where signals or hangs are the point (launch, stop): about 12 s unmutated.
    "ddp_node": Target(
        "ansible/roles/train/files/ddp_node.py",
        (
            "tests/unit/test_launch_node_runner.py",
            "tests/unit/test_node_runner_launch.py",
            "tests/unit/test_node_runner_poll.py",
            "tests/unit/test_node_runner_stop.py",
            "tests/unit/test_node_runner_unpack.py",
            "tests/unit/test_progress_contract.py",  # the report kinds that the launcher and the callback share
        ),
        60,
    ),
    # Master and peers as processes on loopback: about 8 s unmutated.
    "ddp_prepare": Target("ansible/roles/train/files/ddp_prepare.py", ("tests/unit/test_node_prepare.py",), 60),
    "checkpoint": Target("train/ddp_train/checkpoint.py", ("tests/unit/test_checkpoint.py",), 60),
    # The data tests only (so every new one counts): the model tests in the same file cost seconds.
    "data": Target(
        "train/ddp_train/data.py",
        (
            "tests/unit/test_train_data_models.py",
            "-k",
            "not activation_checkpointing and not resnet50 and not build_model",
        ),
        60,
    ),
}
GROUPS = {"filters": ("validators", "gpu_stack_versions"), "train": ("checkpoint", "data")}
PRAGMA = "pragma: no mutate"
# Children of these fields are never mutated: annotations are not evaluated (from __future__ import annotations).
UNEVALUATED = {"annotation", "returns", "type_comment", "pattern"}


# --- mutants


@dataclass(frozen=True)
class Mutant:
    line: int
    start: int  # byte offsets in the source
    end: int
    replacement: str
    description: str

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


COMPARE_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Lt: (ast.LtE, ast.GtE),
    ast.LtE: (ast.Lt, ast.Gt),
    ast.Gt: (ast.GtE, ast.LtE),
    ast.GtE: (ast.Gt, ast.Lt),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
# Div is left alone: in these modules it joins paths far more often than it divides.
BINOP_SWAPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div}


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_str(node: object) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _walk(node: ast.AST, skip: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node, and whether to leave it alone: docstrings, annotations, f-strings, and the keys of
    subscripts (row["key"] -> row["XXkeyXX"] only ever raises a KeyError, which any test notices)."""
    yield node, skip
    docstring = isinstance(node, ast.Expr) and _is_str(node.value)
    for name, value in ast.iter_fields(node):
        child_skip = skip or docstring or name in UNEVALUATED or isinstance(node, ast.JoinedStr)
        key = isinstance(node, ast.Subscript) and name == "slice" and _is_str(value)
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _walk(child, child_skip or key)


def _constant_replacements(value: object) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int | float):
        return [value + 1]
    if isinstance(value, str):
        return [f"XX{value}XX"]
    return []  # None, bytes, Ellipsis


def find_mutants(source: bytes) -> list[Mutant]:
    """Every mutant of a module's source that still parses and differs from it as a syntax tree."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def span(node: ast.AST) -> tuple[int, int]:
        return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset

    def text(node: ast.AST) -> str:
        begin, end = span(node)
        return source[begin:end].decode()

    found: list[Mutant] = []

    def add(node: ast.AST, replacement: str, description: str) -> None:
        if PRAGMA in lines[node.lineno - 1].decode(errors="replace"):
            return
        begin, end = span(node)
        found.append(Mutant(node.lineno, begin, end, replacement, description))

    def swapped(node: ast.AST, change: Callable[[ast.AST], None]) -> str:
        new = copy.deepcopy(node)
        change(new)
        return ast.unparse(new)

    for node, skip in _walk(tree):
        if skip:
            continue
        match node:
            case ast.Compare():
                for i, op in enumerate(node.ops):
                    for new_op in COMPARE_SWAPS[type(op)]:
                        new = swapped(node, lambda n, i=i, new_op=new_op: n.ops.__setitem__(i, new_op()))
                        add(node, f"({new})", f"`{_short(text(node))}` -> `{_short(new)}`")
            case ast.BoolOp():
                new = swapped(node, lambda n: setattr(n, "op", ast.Or() if isinstance(n.op, ast.And) else ast.And()))
                add(node, f"({new})", f"`{_short(text(node))}` -> `{_short(new)}`")
            case ast.BinOp() if type(node.op) in BINOP_SWAPS:
                new = swapped(node, lambda n: setattr(n, "op", BINOP_SWAPS[type(n.op)]()))
                add(node, f"({new})", f"`{_short(text(node))}` -> `{_short(new)}`")
            case ast.UnaryOp(op=ast.Not()):
                add(node, f"({ast.unparse(node.operand)})", f"`{_short(text(node))}` -> drop the not")
            case ast.Constant():
                for value in _constant_replacements(node.value):
                    add(node, f"({value!r})", f"`{_short(text(node))}` -> `{_short(repr(value))}`")
            case ast.Expr(value=ast.Call()):
                add(node, "pass", f"remove the call `{_short(text(node))}`")
            case ast.Return(value=value) if value is not None and not (
                isinstance(value, ast.Constant) and value.value is None
            ):
                add(node, "return None", f"`{_short(text(node))}` -> `return None`")
            case ast.Break():
                add(node, "continue", "`break` -> `continue`")
            case ast.Continue():
                add(node, "break", "`continue` -> `break`")
        # Conditions, negated. Not those that start with `not` (dropping it is the same mutant), nor single
        # comparisons (their negation is one of the swaps above).
        tests = [node.test] if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert) else []
        if isinstance(node, ast.comprehension):
            tests = list(node.ifs)
        for test in tests:
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            if not negated and not (isinstance(test, ast.Compare) and len(test.ops) == 1):
                add(test, f"not ({text(test)})", f"negate `{_short(text(test))}`")

    original = ast.dump(tree)
    mutants, seen = [], set()
    for mutant in sorted(found, key=lambda m: (m.start, m.end, m.description)):
        mutated = mutant.apply(source)
        if mutated in seen:
            continue
        seen.add(mutated)
        try:
            if ast.dump(ast.parse(mutated)) == original:
                continue  # the same program (say, parentheses only)
        except SyntaxError:
            continue
        mutants.append(mutant)
    return mutants


def select(mutants: list[Mutant], budget: int | None, seed: int | None) -> list[Mutant]:
    """At most budget mutants: spread evenly over the module, or a random sample with a seed."""
    if budget is None or budget >= len(mutants):
        return mutants
    if seed is not None:
        return sorted(random.Random(seed).sample(mutants, budget), key=lambda m: m.start)
    return [mutants[i * len(mutants) // budget] for i in range(budget)]


# --- running the tests in a private copy


@dataclass
class Outcome:
    killed: int = 0
    timeouts: int = 0
    survivors: list[Mutant] = field(default_factory=list)

    @property
    def tried(self) -> int:
        return self.killed + len(self.survivors)


def make_copy() -> Path:
    """The repository's files (tracked, and untracked ones git does not ignore) in a new temporary directory."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    copy_root = Path(tempfile.mkdtemp(prefix="mutate-"))
    for name in filter(None, names):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # deleted but still in the index, or a submodule
            dest = copy_root / os.fsdecode(name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
    return copy_root


class Runner:
    """Runs pytest in the copy; every process it starts carries a tag, so that leftovers can be found and ended."""

    def __init__(self, copy_root: Path) -> None:
        self.copy_root = copy_root
        self.tag = f"MUTATE_RUN={uuid.uuid4().hex}"
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Written mutants can share a size and an mtime second with the last one: never trust cached bytecode.
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"
        key, value = self.tag.split("=")
        self.env[key] = value
        self.runs = 0

    def run(self, tests: tuple[str, ...], timeout_s: float) -> tuple[str, float, str]:
        """("passed" | "failed" | "timeout", seconds, output)."""
        self.runs += 1
        basetemp = self.copy_root / ".mutate-tmp" / str(self.runs)
        basetemp.parent.mkdir(exist_ok=True)  # pytest creates basetemp itself, but not its parent
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}"]
        # In a PID namespace of its own, with its own /proc: a mutant of the node runner's stop can signal every
        # process it sees (a negated tag check), which outside it would be every process of this machine's user.
        # --kill-child: when the namespace's first process dies, the kernel ends every process in it. That first
        # process is a shell, which reaps the orphans a stopped job leaves (a zombie still counts as alive).
        sandbox = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c", '"$@" & wait $!', "-"]
        if os.geteuid() != 0:
            sandbox[1:1] = ["--user", "--map-root-user"]
        began = time.monotonic()
        child = subprocess.Popen(
            [*sandbox, *command, *tests],
            cwd=self.copy_root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = child.communicate(timeout=timeout_s)
            result = "passed" if child.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            result, output = "timeout", b""
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            self.end_leftovers()
            shutil.rmtree(basetemp, ignore_errors=True)
        return result, time.monotonic() - began, output.decode(errors="replace")

    def end_leftovers(self) -> None:
        """Kill what a test left running (a mutant can break the code that stops the job): ours by tag only."""
        marker = self.tag.encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                continue  # gone, or not ours to read


def check_module(
    name: str,
    target: Target,
    runner: Runner,
    mutants: list[Mutant],
    total: int,
    timeout_s: float | None,
    outcome: Outcome,
) -> bool:
    """Runs each mutant against the module's tests, counting into outcome; False when they fail unmutated."""
    path = runner.copy_root / target.path
    original = path.read_bytes()
    print(f"\n== {name}: {target.path}, {len(mutants)} of {total} mutants; tests: {' '.join(target.tests)}")
    result, seconds, output = runner.run(target.tests, max(timeout_s or target.timeout_s, 120))
    if result != "passed":
        print(f"   the tests {result} without any mutant; {name} skipped. Their output:\n{output[-3000:]}")
        return False
    limit = timeout_s or max(target.timeout_s, 5 * seconds)
    print(f"   unmutated: passed in {seconds:.1f} s; per-mutant timeout {limit:.0f} s")
    where = Path(target.path).name
    try:
        for number, mutant in enumerate(mutants, 1):
            path.write_bytes(mutant.apply(original))
            try:
                result, seconds, _ = runner.run(target.tests, limit)
            finally:
                path.write_bytes(original)
            if result == "passed":
                outcome.survivors.append(mutant)
                verdict = "SURVIVED"
            else:
                outcome.killed += 1
                outcome.timeouts += result == "timeout"
                verdict = "killed" if result == "failed" else "timeout"
            print(
                f"   [{number:>{len(str(len(mutants)))}}/{len(mutants)}] {verdict:<8} {where}:{mutant.line}  "
                f"{mutant.description}  ({seconds:.1f} s)",
                flush=True,
            )
    finally:
        path.write_bytes(original)
    return True


def report(results: dict[str, Outcome | None]) -> None:
    print("\n== summary")
    for name, outcome in results.items():
        target = TARGETS[name]
        if outcome is None:
            print(f"{name}: not checked (its tests fail unmutated)")
            continue
        timeouts = f" ({outcome.timeouts} by timeout)" if outcome.timeouts else ""
        print(f"{name}: {outcome.tried} tried, {outcome.killed} killed{timeouts}, {len(outcome.survivors)} survived")
        for mutant in outcome.survivors:
            print(f"  {target.path}:{mutant.line}: {mutant.description}")


def parse_lines(spec: str) -> tuple[int, int]:
    first, _, last = spec.partition("-")
    return int(first), int(last or first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    choices = ", ".join([*TARGETS, *GROUPS])
    parser.add_argument("--module", action="append", help=f"one of {choices}; repeat or comma-separate")
    parser.add_argument("--max-mutants", type=int, metavar="N", help="at most N mutants per module (spread evenly)")
    parser.add_argument("--seed", type=int, help="with --max-mutants: a random sample instead")
    parser.add_argument("--lines", type=parse_lines, metavar="A-B", help="only mutants on lines A to B")
    parser.add_argument("--timeout", type=float, metavar="S", help="per-mutant timeout (default: per module)")
    parser.add_argument("--list", action="store_true", help="list the mutants that would run, run nothing")
    args = parser.parse_args(argv)

    names: list[str] = []
    for item in ",".join(args.module or TARGETS).split(","):
        if item not in TARGETS and item not in GROUPS:
            parser.error(f"unknown module {item!r}; choose from {choices}")
        names.extend(n for n in GROUPS.get(item, (item,)) if n not in names)

    plans = {}
    for name in names:
        mutants = find_mutants((ROOT / TARGETS[name].path).read_bytes())
        if args.lines:
            mutants = [m for m in mutants if args.lines[0] <= m.line <= args.lines[1]]
        plans[name] = (select(mutants, args.max_mutants, args.seed), len(mutants))
    if args.list:
        for name, (mutants, total) in plans.items():
            print(f"== {name}: {len(mutants)} of {total} mutants")
            for mutant in mutants:
                print(f"  {TARGETS[name].path}:{mutant.line}: {mutant.description}")
        return 0

    # SIGINT (even when started in the background, which ignores it) and SIGTERM end the run like Ctrl-C: the
    # tests running are killed, the copy removed.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results: dict[str, Outcome | None] = {}
    copy_root = make_copy()
    print(f"copy of the repository: {copy_root} (removed at the end)")
    try:
        runner = Runner(copy_root)
        for name, (mutants, total) in plans.items():
            results[name] = outcome = Outcome()
            if not check_module(name, TARGETS[name], runner, mutants, total, args.timeout, outcome):
                results[name] = None
    except KeyboardInterrupt:
        print("\ninterrupted; the modules finished so far:")
        report(results)
        return 130
    finally:
        shutil.rmtree(copy_root, ignore_errors=True)
    report(results)
    return 2 if None in results.values() else 0


if __name__ == "__main__":
    sys.exit(main())
