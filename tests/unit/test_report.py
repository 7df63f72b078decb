"""A run's report.html: self-contained, every plot embedded, and a browser shows them."""

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from ddp_launcher import report
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]

MATPLOTLIB_BLUE = (31, 119, 180)  # the first line colour of every plot
PLOTS = {"Loss", "Throughput (samples/s)", "Step time and communication time (s)", "Communication share",
         "Checkpoint stalls", "Step time per node"}  # fmt: skip


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
