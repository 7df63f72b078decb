"""A run's report: artifacts/<run_id>/report.html, self-contained (plots embedded as PNG), readable offline.

    python -m ddp_launcher.report artifacts/<run_id> [--compare artifacts/<other_run_id>]
    (`ddp report [--run ID] [--compare ID]` finds the directories by run id)

Plots what the run collected: loss and eval curves, samples/s, step and communication time, the share of each
step spent communicating, and how long each checkpoint stalled training; then the run's status, settings and
versions from run.json. With --compare, another run's curves are drawn over this one's. `make report RUN=a
[COMPARE=b]` runs it.

At a run's end (ddp_launcher.artifacts.finish) the page is written at once with its tables and a note that the
plots are coming, and a process of its own draws the plots and replaces the page whole (matplotlib's import and
drawing take most of a second, which `make train` and `make stop` no longer wait for).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .artifacts import write_atomic
from .contract import attempt_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The page's note while its plots are still being drawn (tests and scripts wait for it to go).
PLOTS_PENDING = '<p id="plots-pending">'


@dataclass
class RunData:
    name: str
    record: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def load(run_dir: Path) -> RunData:
    metrics = run_dir / "metrics"
    return RunData(
        name=run_dir.name,
        record=_json(run_dir / "run.json"),
        summary=_json(metrics / "summary.json"),
        steps=_jsonl(metrics / "metrics.jsonl"),
        checkpoints=_jsonl(metrics / "checkpoints.jsonl"),
    )


def _series(run: RunData, key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in run.steps if isinstance(r.get(key), int | float)]
    return [p[0] for p in points], [p[1] for p in points]


def comm_share(run: RunData) -> tuple[list[float], list[float]]:
    """Per step, the fraction of the step spent in communication (where the program measured it)."""
    points = [
        (r["step"], r["comm_time_s"] / r["step_time_s"])
        for r in run.steps
        if isinstance(r.get("comm_time_s"), int | float) and r.get("step_time_s")
    ]
    return [p[0] for p in points], [p[1] for p in points]


def per_node(run: RunData) -> dict[str, tuple[list[int], list[float]]]:
    """node -> (steps, its slowest rank's step time) from the log steps that carry node_step_time_s."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for record in run.steps:
        for node, seconds in (record.get("node_step_time_s") or {}).items():
            steps, times = out.setdefault(node, ([], []))
            steps.append(record["step"])
            times.append(seconds)
    return out


def slowest_node(run: RunData) -> str | None:
    """The node whose mean step time is highest, and by how much, when there is more than one node."""
    means = {node: sum(times) / len(times) for node, (_, times) in per_node(run).items()}
    if len(means) < 2:
        return None
    slow, fast = max(means, key=means.__getitem__), min(means, key=means.__getitem__)
    return f"{slow}: {means[slow]:.4f} s per step against {means[fast]:.4f} s on {fast}"


# TensorBoard's default smoothing weight: noisy series are drawn raw (faint) with this smoothed line over them.
SMOOTHING = 0.6


def smoothed(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so that the first points are not pulled
    towards zero."""
    out, average = [], 0.0
    for count, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**count))
    return out


def _noisy(axes: Axes, x: list[float], y: list[float], label: str) -> None:
    """Raw points faint, the smoothed line solid, in one colour."""
    (raw,) = axes.plot(x, y, alpha=0.3, linewidth=0.8)
    axes.plot(x, smoothed(y), color=raw.get_color(), label=f"{label} (smoothed {SMOOTHING})")


def _figure() -> tuple[Figure, Axes]:
    """A figure of its own, drawn to memory by Agg: no pyplot, whose state and GUI backends a report never needs
    (and whose import costs a fifth of a second of every run's end)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.2))
    # Fixed margins that hold a title, tick labels and an axis label: a layout engine would draw every figure
    # twice to find them.
    figure.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.2)
    return figure, figure.subplots()


def _titled(axes: Axes, title: str, **settings: Any) -> None:
    """The title at a fixed height: placed automatically, it costs a layout pass over every axis of every plot
    (a quarter of the whole report's drawing), to clear top tick labels that these plots do not have."""
    axes.set_title(title, y=1.0)
    axes.set(**settings)


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode()


def plots(runs: list[RunData]) -> dict[str, str]:
    """Title -> base64 PNG, for each plot the runs have data for (the first run drawn first, others over it)."""
    # title: ([(metric, label)], noisy: drawn smoothed, y scale)
    panels = {
        "Loss": ([("loss", "train"), ("eval_loss", "eval")], False, "linear"),
        "Loss, log scale": ([("loss", "train"), ("eval_loss", "eval")], False, "log"),
        "Throughput (samples/s)": ([("samples_per_s", "samples/s")], True, "linear"),
        "Step time and communication time (s)": (
            [("step_time_s", "step"), ("comm_time_s", "communication")],
            True,
            "linear",
        ),
    }
    out = {}
    for title, (keys, noisy, scale) in panels.items():
        series = [(run, label, *_series(run, key)) for run in runs for key, label in keys]
        series = [(run, label, x, y) for run, label, x, y in series if x]
        if not series or (scale == "log" and any(v <= 0 for *_, y in series for v in y)):
            continue
        figure, axes = _figure()
        for run, label, x, y in series:
            if noisy:
                _noisy(axes, x, y, f"{run.name}: {label}")
            else:
                axes.plot(x, y, marker="." if len(x) < 50 else None, label=f"{run.name}: {label}")
        _titled(axes, title, xlabel="step", yscale=scale)
        axes.legend(fontsize=7)
        out[title] = _png(figure)
    node_lines = [(run, node, steps, times) for run in runs for node, (steps, times) in per_node(run).items()]
    if node_lines:
        figure, axes = _figure()
        for run, node, steps, times in node_lines:
            axes.plot(steps, times, marker=".", label=f"{run.name}: {node}")
        _titled(axes, "Step time per node, its slowest rank (s)", xlabel="step")
        axes.legend(fontsize=7)
        out["Step time per node"] = _png(figure)
        # A straggler at a glance: one bar per node, the node's name on the axis.
        figure, axes = _figure()
        names = [f"{node}" if len(runs) == 1 else f"{run.name}\n{node}" for run, node, _, _ in node_lines]
        axes.bar(names, [sum(times) / len(times) for *_, times in node_lines])
        _titled(axes, "Mean step time by node, its slowest rank (s)", xlabel="node")
        out["Mean step time by node"] = _png(figure)
    share = [(run, *comm_share(run)) for run in runs]
    if any(x for _, x, _ in share):
        figure, axes = _figure()
        for run, x, y in share:
            if x:
                _noisy(axes, x, [100 * v for v in y], run.name)
        _titled(axes, "Communication share of each step (%)", xlabel="step", ylim=(0, 100))
        axes.legend(fontsize=7)
        out["Communication share"] = _png(figure)
    if any(run.checkpoints for run in runs):
        figure, axes = _figure()
        for run in runs:
            blocked = [(c["step"], c.get("ckpt_block_s") or 0.0) for c in run.checkpoints]
            axes.bar([b[0] for b in blocked], [b[1] for b in blocked], width=2, alpha=0.7, label=f"{run.name}")
        _titled(axes, "Training stalled by each checkpoint (s)", xlabel="step")
        axes.legend(fontsize=7)
        out["Checkpoint stalls"] = _png(figure)
    return out


def _rounded(value: object, digits: int) -> object:
    return round(value, digits) if isinstance(value, float) else value


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def _table(rows: dict[str, Any]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_cell(v))}</td></tr>" for k, v in rows.items())
    return f"<table>{cells}</table>" if rows else "<p>-</p>"


def _attempts(attempts: list[dict[str, Any]] | None) -> str:
    if not attempts:
        return "<p>One attempt.</p>"
    rows = {
        f"{number}. {attempt['run_id']}": attempt["status"]
        + (f" on {attempt['failed_node']}: {attempt['reason']}" if attempt.get("reason") else "")
        for number, attempt in enumerate(attempts, 1)
    }
    return _table(rows)


def _section(rows: dict[str, Any] | None, absent: str) -> str:
    if not rows:
        return f"<p>{html.escape(absent)}</p>"
    # A package list reads best one per line.
    return _table({k: "\n".join(v) if isinstance(v, list) else v for k, v in rows.items()})


def render(run: RunData, compare: RunData | None = None, plots_instead: str | None = None) -> str:
    """The page; with plots_instead, that note (HTML) where the plots go, and matplotlib is not touched."""
    runs = [run] + ([compare] if compare else [])
    images = plots(runs) if plots_instead is None else {}
    figures = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{png}"></figure>'
        for title, png in images.items()
    )
    record, summary = run.record, run.summary
    overview = {
        "status": record.get("status", "unknown"),
        "job": record.get("job"),
        "started": record.get("started"),
        "ended": record.get("ended"),
        "steps": f"{summary.get('first_step')}..{summary.get('last_step')}" if summary else None,
        "final loss": _rounded(summary.get("final_loss"), 4),
        "mean samples/s": _rounded(summary.get("mean_samples_per_s"), 1),
        "world size": summary.get("world_size"),
        "checkpoint stall fraction": (
            round(summary["checkpoint_block_s_total"] / summary["wall_time_s"], 4)
            if summary.get("wall_time_s") and "checkpoint_block_s_total" in summary
            else None
        ),
        "slowest node": slowest_node(run),
        "code": record.get("code_sha256") or record.get("git_commit"),
        "attempt": attempt_of(record),
    }
    title = f"Run {run.name}" + (f" compared with {compare.name}" if compare else "")
    no_plots = (
        plots_instead
        if plots_instead is not None
        else ("" if images else "<p>The program wrote no metrics (metrics.jsonl) to DDP_OUTPUT_DIR.</p>")
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}th{{text-align:left;padding-right:1em}}
td{{font-family:monospace;white-space:pre-wrap}}img{{max-width:100%}}</style></head>
<body><h1>{html.escape(title)}</h1>
<h2>Outcome</h2>{_table(overview)}
<h2>Plots</h2>{figures}{no_plots}
<h2>Settings</h2>{_table(record.get("settings", {}))}
<h2>DDP in effect</h2>{_table(summary.get("ddp", {}))}
<h2>Attempts</h2>{_attempts(record.get("attempts"))}
<h2>Job environment</h2>{_section(record.get("env"), "No requirements: the runtime's own packages.")}
<h2>Dataset</h2>{_section(record.get("data"), "No dataset synced (DATA=).")}
<h2>Versions</h2>{_table(record.get("versions", {}))}
</body></html>
"""


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--compare", type=Path, help="another run's artifacts directory, drawn over this one")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"report: no run directory {args.run_dir}", file=sys.stderr)
        return 2
    print(f"report: {write(args.run_dir, args.compare)}")
    return 0


def write(run_dir: Path, compare: Path | None = None, with_plots: bool = True) -> Path:
    """run_dir/report.html, drawn from the run's files (and another run's, drawn over it), replaced whole. Drawn
    again while run.json changes under it (a retry's launcher adds the attempts to every attempt's record)."""
    while True:
        source = _stamp(run_dir / "run.json")
        data, other = load(run_dir), load(compare) if compare else None
        if not with_plots:
            page = render(data, other, PLOTS_PENDING + "The plots are being drawn: reload in a moment.</p>")
        else:
            try:
                page = render(data, other)
            except Exception as error:  # the tables are worth having without the plots
                page = render(data, other, f"<p>The plots could not be drawn ({html.escape(repr(error))}).</p>")
        if _stamp(run_dir / "run.json") == source:
            break
    out = run_dir / "report.html"
    write_atomic(out, page)
    return out


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def write_now_and_draw_later(run_dir: Path) -> Path:
    """report.html now with its tables; its plots by a process of its own, which replaces the page once drawn."""
    out = write(run_dir, with_plots=False)
    subprocess.Popen(
        [sys.executable, "-m", f"{__package__}.report", str(run_dir)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # neither make's Ctrl-C nor the play's end cuts it short
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
