"""A run's report.html: self-contained, every plot embedded, and a browser shows them."""

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _make import finished_report
from ddp_launcher import report
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]

MATPLOTLIB_BLUE = (31, 119, 180)  # the first line colour of every plot
PLOTS = {"Loss", "Loss, log scale", "Throughput (samples/s)", "Step time and communication time (s)",
         "Communication share", "Checkpoint stalls", "Step time per node", "Mean step time by node"}  # fmt: skip


def fake_run(directory: Path, steps: int = 30) -> Path:
    metrics = directory / "metrics"
    metrics.mkdir(parents=True)
    lines = [
        {"step": s, "target_step": steps, "loss": 2.0 / s, "samples_per_s": 4000 + s, "step_time_s": 0.02,
         "comm_time_s": 0.005, **({"eval_loss": 1.5 / s} if s % 10 == 0 else {})}
        for s in range(1, steps + 1)
    ]  # fmt: skip
    for line in lines[::10]:  # the log steps carry each node's slowest rank; node1 straggles
        line["node_step_time_s"] = {"node0": 0.02, "node1": 0.05}
    (metrics / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    checkpoints = [{"step": s, "ckpt_block_s": 0.03, "ckpt_write_s": 0.3} for s in (10, 20, 30)]
    (metrics / "checkpoints.jsonl").write_text("".join(json.dumps(c) + "\n" for c in checkpoints))
    summary = {"first_step": 1, "last_step": steps, "final_loss": 0.0666666, "wall_time_s": 10.0,
               "checkpoint_block_s_total": 0.09, "ddp": {"comm_hook": "fp16_compress_hook"}}  # fmt: skip
    (metrics / "summary.json").write_text(json.dumps(summary))
    record = {"status": "succeeded", "job": "fake", "settings": {"runtime": "host"}, "versions": {"python": "3.11"}}
    (directory / "run.json").write_text(json.dumps(record))
    return directory


def images(page: str) -> dict[str, bytes]:
    found = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">', page)
    return {alt: base64.b64decode(data) for alt, data in found}


def test_report_embeds_a_png_of_every_plot_and_the_runs_facts(tmp_path):
    run = fake_run(tmp_path / "run-a")
    assert report.main([str(run)]) == 0
    page = (run / "report.html").read_text()
    pngs = images(page)
    assert set(pngs) == PLOTS
    assert all(png.startswith(b"\x89PNG\r\n") for png in pngs.values())
    assert "http" not in page.replace("charset", "")  # nothing to fetch: opens offline
    facts = ("succeeded", "fp16_compress_hook", "0.0667", "0.009", "node1: 0.0500 s per step against 0.0200 s on node0")
    for fact in facts:  # 0.009: stall fraction 0.09 / 10
        assert fact in page


def test_compare_draws_the_other_run_too_and_a_run_without_metrics_says_so(tmp_path):
    a, b = fake_run(tmp_path / "run-a"), fake_run(tmp_path / "run-b", steps=20)
    report.main([str(a), "--compare", str(b)])
    page = (a / "report.html").read_text()
    assert "Run run-a compared with run-b" in page
    bare = tmp_path / "bare"
    bare.mkdir()
    report.main([str(bare)])
    assert "wrote no metrics" in (bare / "report.html").read_text()


def test_a_run_s_end_writes_the_tables_at_once_and_the_plots_after(tmp_path):
    run = fake_run(tmp_path / "run-a")
    report.write(run, with_plots=False)
    page = (run / "report.html").read_text()
    assert report.PLOTS_PENDING in page and not images(page) and "fp16_compress_hook" in page
    report.write_now_and_draw_later(run)
    assert set(images(finished_report(run))) == PLOTS
    assert (run / "report.html").stat().st_mode & 0o777 == 0o644  # as run.json's and MANIFEST's
    assert [path.name for path in run.iterdir() if path.name.startswith(".report.html.")] == []


def test_a_page_whose_plots_fail_keeps_its_tables_and_says_why(tmp_path, monkeypatch):
    def broken(_runs: list) -> dict:
        raise RuntimeError("no fonts")

    run = fake_run(tmp_path / "run-a")
    monkeypatch.setattr(report, "plots", broken)
    page = report.write(run).read_text()
    assert "The plots could not be drawn (RuntimeError(&#x27;no fonts&#x27;))." in page
    assert "fp16_compress_hook" in page and report.PLOTS_PENDING not in page


def test_a_record_that_changes_while_the_page_is_drawn_is_drawn_again(tmp_path, monkeypatch):
    # A retry's launcher adds the attempts to every attempt's run.json while a drawing may be under way.
    run = fake_run(tmp_path / "run-a")
    original = report.load

    def load_while_the_record_changes(run_dir: Path) -> report.RunData:
        data = original(run_dir)
        if "attempts" not in data.record:
            attempts = [{"run_id": "fake-try1", "status": "failed"}, {"run_id": "fake-try2", "status": "succeeded"}]
            (run_dir / "run.json").write_text(json.dumps(data.record | {"attempts": attempts}))
        return data

    monkeypatch.setattr(report, "load", load_while_the_record_changes)
    page = report.write(run, with_plots=False).read_text()
    assert "<th>2. fake-try2</th><td>succeeded</td>" in page


def test_smoothing_is_tensorboards_debiased_moving_average():
    # weight 0.5 over 1, 0, 1, 0: the averages 0.5, 0.25, 0.625, 0.3125 divided by 1 - 0.5**n.
    expected = [1.0, 0.25 / 0.75, 0.625 / 0.875, 0.3125 / 0.9375]
    assert report.smoothed([1.0, 0.0, 1.0, 0.0], weight=0.5) == pytest.approx(expected)
    assert report.smoothed([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])  # no pull towards zero at the start
    assert report.smoothed([]) == []


def test_noisy_series_are_drawn_raw_and_smoothed_in_one_colour():
    _, axes = report._figure()
    report._noisy(axes, [1, 2, 3], [10.0, 0.0, 10.0], "run: samples/s")
    raw, line = axes.get_lines()
    assert list(raw.get_ydata()) == [10.0, 0.0, 10.0] and raw.get_alpha() < 0.5
    assert list(line.get_ydata()) == report.smoothed([10.0, 0.0, 10.0]) and line.get_color() == raw.get_color()
    assert line.get_label() == "run: samples/s (smoothed 0.6)"


def test_the_log_scale_loss_is_left_out_when_a_loss_is_not_positive(tmp_path):
    run = fake_run(tmp_path / "run-a")
    metrics = run / "metrics" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + json.dumps({"step": 31, "loss": 0.0}) + "\n")
    report.main([str(run)])
    assert set(images((run / "report.html").read_text())) == PLOTS - {"Loss, log scale"}


def test_the_node_axis_names_the_nodes(monkeypatch):
    run = report.RunData("r", steps=[{"step": 1, "node_step_time_s": {"gpu-a": 0.1, "gpu-b": 0.3}}])
    calls = []
    original = report._figure

    def capture():
        made = original()
        calls.append(made[1])
        return made

    monkeypatch.setattr(report, "_figure", capture)
    report.plots([run])
    bars = next(axes for axes in calls if axes.get_title().startswith("Mean step time by node"))
    assert [tick.get_text() for tick in bars.get_xticklabels()] == ["gpu-a", "gpu-b"]
    assert [bar.get_height() for bar in bars.patches] == [0.1, 0.3]


def test_a_browser_shows_the_plots(tmp_path):
    chromium = shutil.which("chromium")
    assert chromium, "no chromium: tests/host/ensure-tools.sh installs it (make unit runs it)"
    run = fake_run(tmp_path / "run-a")
    report.main([str(run)])
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1000,1400",
         f"file://{run / 'report.html'}"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    blue = int((np.abs(pixels - MATPLOTLIB_BLUE).max(axis=2) < 20).sum())
    assert blue > 1000, f"only {blue} plot-coloured pixels: the images did not render"
