"""Resuming on another world size (torchrun, gloo): 2 processes, then 1, then 2 again, on one checkpoint dir.

data.py's contract (BatchStream.restore): a different world size resumes at the same share of the epoch, i.e.
after the same number of the epoch's samples (global_samples_in_epoch, whole global batches of the new size).
"""

import subprocess
from pathlib import Path

import pytest
from _train_helpers import SMOKE, TRAIN, metrics, torchrun
from ddp_train import checkpoint as ckpt
from ddp_train.config import load_config
from ddp_train.data import build_datasets, build_stream

pytestmark = pytest.mark.slow

SEED = 3


def run(nproc: int, max_steps: int, ckpt_dir: Path, out_dir: Path) -> subprocess.CompletedProcess:
    args = ("--max-steps", max_steps, "--checkpoint-dir", ckpt_dir, "--output-dir", out_dir, "--seed", SEED)
    result = torchrun(TRAIN, "--config", SMOKE, "--checkpoint-every", "10", *args, nproc=nproc)
    assert result.returncode == 0, f"train.py failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def data_state(ckpt_dir: Path, step: int) -> dict:
    return ckpt.load_checkpoint(ckpt.checkpoint_path(ckpt_dir, step))["data"]


def test_resume_on_another_world_size_continues_at_the_same_sample_of_the_epoch(tmp_path):
    cfg = load_config(SMOKE).data
    batch = cfg.batch_size
    train_set, _, _ = build_datasets(cfg, SEED)
    epoch_samples_2 = len(build_stream(train_set, cfg, 0, 2, seed=SEED, cuda=False).loader) * batch * 2
    ckpt_dir = tmp_path / "ckpt"

    run(2, 10, ckpt_dir, tmp_path / "a")
    assert data_state(ckpt_dir, 10) == {"epoch": 0, "position": 10, "global_samples_in_epoch": 10 * batch * 2}

    one = run(1, 20, ckpt_dir, tmp_path / "b")  # 1 process takes over after 640 samples of epoch 0
    assert "checkpoint from 2 ranks, now 1" in one.stderr
    assert [r["step"] for r in metrics(tmp_path / "b")] == list(range(11, 21))
    samples = 10 * batch * 2 + 10 * batch  # 10 global batches of 64, then 10 of 32: none repeated or skipped
    assert data_state(ckpt_dir, 20) == {"epoch": 0, "position": samples // batch, "global_samples_in_epoch": samples}

    run(2, 40, ckpt_dir, tmp_path / "c")  # and back to 2 processes
    left = (epoch_samples_2 - samples) // (batch * 2)  # global batches of 64 left in epoch 0
    epochs = [r["epoch"] for r in metrics(tmp_path / "c")]
    assert epochs == [0] * left + [1] * (20 - left), "epoch 0 ended early or late: samples repeated or skipped"
    into_next = 20 - left
    assert data_state(ckpt_dir, 40) == {
        "epoch": 1,
        "position": into_next,
        "global_samples_in_epoch": into_next * batch * 2,
    }
