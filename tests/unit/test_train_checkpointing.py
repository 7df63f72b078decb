"""Staged (checkpoint.async) and blocking saves through the real loop, in one process (a gloo group of one):
the same checkpoints either way, their cost in checkpoints.jsonl and summary.json, and a failed background
write that stops the run."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _train_helpers import SMOKE, gloo_group_of_one, metrics, summary
from ddp_train import checkpoint as ckpt
from ddp_train import main as train_main
from ddp_train.config import load_config


def run(directory: Path, *overrides: str) -> None:
    cfg = load_config(SMOKE, [f"checkpoint.dir={directory}", "checkpoint.every=10", "run.max_steps=20", *overrides])
    with gloo_group_of_one() as info:
        train_main.run(cfg, info)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def checkpoint_records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "checkpoints.jsonl").read_text().splitlines()]


def test_staged_and_blocking_saves_write_the_same_checkpoints_and_report_their_cost(tmp_path):
    for mode in ("true", "false"):
        run(tmp_path / mode, f"checkpoint.async={mode}")
    for step in (10, 20):
        staged, blocking = (ckpt.load_checkpoint(tmp_path / m / f"ckpt-{step:08d}.pt") for m in ("true", "false"))
        for part in ("model", "optimizer", "data", "scheduler", "rng"):
            assert same(staged[part], blocking[part]), f"step {step}: {part} differs"
    for mode in ("true", "false"):
        records, s = checkpoint_records(tmp_path / mode), summary(tmp_path / mode)
        assert [(r["step"], r["async"]) for r in records] == [(10, mode == "true"), (20, mode == "true")]
        for r in records:
            assert r["path"].endswith(f"ckpt-{r['step']:08d}.pt") and r["bytes"] > 0
            assert r["ckpt_block_s"] > 0 and r["ckpt_write_s"] > 0
        assert s["checkpoint_async"] is (mode == "true") and s["checkpoints_written"] == 2
        assert s["checkpoint_block_s_total"] == pytest.approx(sum(r["ckpt_block_s"] for r in records), abs=1e-5)
        assert s["checkpoint_write_s_total"] == pytest.approx(sum(r["ckpt_write_s"] for r in records), abs=1e-5)
        assert 0 < s["checkpoint_block_s_total"] < s["wall_time_s"]
        if mode == "false":  # the loop stood still for the whole write
            assert all(r["ckpt_block_s"] >= r["ckpt_write_s"] for r in records)


def test_a_resumed_run_keeps_the_checkpoint_records_of_its_lineage(tmp_path):
    run(tmp_path)
    (tmp_path / "ckpt-00000020.pt").unlink()  # as if the run had died writing it
    run(tmp_path, "run.max_steps=30")
    assert [r["step"] for r in checkpoint_records(tmp_path)] == [10, 20, 30]
    assert [r["step"] for r in metrics(tmp_path)] == list(range(1, 31))


def test_a_failed_background_write_stops_the_run(tmp_path, monkeypatch):
    real_save = ckpt.atomic_save

    def full_disk_at_10(state: dict, path: Path) -> str:
        if state["step"] == 10:
            raise OSError(28, "No space left on device")
        return real_save(state, path)

    monkeypatch.setattr(ckpt, "atomic_save", full_disk_at_10)
    with pytest.raises(ckpt.CheckpointError, match=r"ckpt-00000010.pt failed: OSError: .*No space left on device"):
        run(tmp_path, "run.max_steps=30")
    # raised before one of the next steps trains, at the latest by the save of step 20 (it waits for the write)
    assert 10 <= metrics(tmp_path)[-1]["step"] <= 20
    assert summary(tmp_path)["status"] == "failed"
    assert ckpt.list_checkpoints(tmp_path) == []
