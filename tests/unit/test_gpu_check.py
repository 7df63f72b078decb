"""make gpu-check's parts that need no GPU: its refusal without one, the MFU arithmetic, the run verdicts."""

import math
import subprocess
import sys

import _train_helpers
import gpu_check
import pytest


def test_without_a_gpu_it_says_so_and_fails():
    done = subprocess.run(
        [sys.executable, str(_train_helpers.TRAIN_DIR / "gpu_check.py")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "no CUDA device here" in done.stderr


def test_peak_by_device_name_most_specific_first():
    assert gpu_check.peak_bf16("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_bf16("NVIDIA H100 80GB HBM3") == gpu_check.peak_bf16("NVIDIA H200") == 989e12
    assert gpu_check.peak_bf16("Tesla T4") is None


def test_mfu_from_tokens_per_second():
    shape = {"parameters": 1_000_000, "n_layers": 2, "d_model": 64, "seq_len": 128}
    per_token = 6 * 1_000_000 + 12 * 2 * 64 * 128
    assert gpu_check.flops_per_token(**shape) == per_token
    run = {"metrics": [{"tokens_per_s": 10.0}, {"tokens_per_s": 1000.0}, {"tokens_per_s": 1000.0}]}
    result = gpu_check.mfu(run, shape, "NVIDIA H200", gpus=2)
    assert result["value"] == pytest.approx(round(1000.0 * per_token / (989e12 * 2), 4))
    assert gpu_check.mfu(run, shape, "Tesla T4", gpus=1)["value"] is None


def test_a_run_fails_when_the_hook_or_scaler_in_effect_is_not_the_one_asked_for():
    summary = {"first_loss": 10.0, "final_loss": 7.0, "ddp": {"comm_hook": "fp16_compress_hook", "grad_scaler": True}}
    assert gpu_check.check_run("fp16", "fp16_compress_hook", True, {"ok": True, "summary": summary})[0] == "PASS"
    verdict, why = gpu_check.check_run("fp16", "bf16_compress_hook", True, {"ok": True, "summary": summary})
    assert verdict == "FAIL" and "not bf16_compress_hook" in why
    nan = {**summary, "final_loss": math.nan}
    assert gpu_check.check_run("fp16", "fp16_compress_hook", True, {"ok": True, "summary": nan})[0] == "FAIL"
