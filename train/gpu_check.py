"""`make gpu-check`: the CUDA paths the CPU tests skip, on a machine with NVIDIA GPUs, in under 8 minutes.

    python train/gpu_check.py [--out DIR] [--steps N]

With every visible GPU (one process each, torchrun --standalone):
  1. the allreduce sweep on the nccl backend (bench_allreduce.py --backend nccl), algbw/busbw per size;
  2. gpu-transformer.yaml for N steps in each of: bf16 autocast + bf16 comm hook; fp16 autocast + GradScaler +
     fp16 comm hook; bf16 + PowerSGD; each must end with a finite loss, and summary.json must show the hook and
     the GradScaler actually in effect (read back from DDP, not from the config);
  3. step MFU of the bf16 run: model FLOPs per step (6 x parameters x tokens, plus attention's 12 x layers x
     d_model x sequence length per token) over step time x the device's peak dense bf16 FLOP/s (PEAK_BF16 below,
     by device name) x GPUs.
Writes DIR/gpu-check.json and prints a table. Without a CUDA device it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRANSFORMER = HERE / "configs" / "gpu-transformer.yaml"
# Dense bf16 tensor-core peak per device (vendor data sheets, without sparsity), by a substring of the name
# torch reports; the first match wins, so the more specific names come first.
PEAK_BF16 = [
    ("H100 PCIe", 756e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
]
# (name, config overrides, the comm hook function summary.json must name, GradScaler expected)
RUNS = [
    ("bf16", ["precision.mode=bf16", "ddp.comm_hook=bf16"], "bf16_compress_hook", False),
    ("fp16", ["precision.mode=fp16", "ddp.comm_hook=fp16"], "fp16_compress_hook", True),
    (
        "powersgd",
        ["precision.mode=bf16", "ddp.comm_hook=powersgd", "ddp.powersgd_start_iter=2"],
        "powerSGD_hook",
        False,
    ),
]


def peak_bf16(device_name: str) -> float | None:
    return next((peak for name, peak in PEAK_BF16 if name in device_name), None)


def flops_per_token(parameters: int, n_layers: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: forward and backward through every weight (6N) and the attention scores."""
    return 6 * parameters + 12 * n_layers * d_model * seq_len


def torchrun(nproc: int, script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return subprocess.run(
        [*command, str(script), *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=HERE
    )


def transformer_shape() -> dict[str, int]:
    # Here, like torch in main(): importing the module (its unit test does) loads no torch.
    from ddp_train.config import load_config
    from ddp_train.data import DataInfo
    from ddp_train.models import build_model

    cfg = load_config(TRANSFORMER)
    info = DataInfo("tokens", vocab_size=cfg.data.vocab_size, seq_len=cfg.data.seq_len)
    model = build_model(cfg.model, info)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "n_layers": cfg.model.n_layers,
        "d_model": cfg.model.d_model,
        "seq_len": cfg.data.seq_len,
    }


def training_run(nproc: int, out: Path, name: str, overrides: list[str], steps: int) -> dict[str, Any]:
    run_dir = out / name
    sets = [arg for override in overrides for arg in ("--set", override)]
    args = ["--config", str(TRANSFORMER), "--max-steps", str(steps), "--output-dir", str(run_dir)]
    done = torchrun(nproc, HERE / "train.py", *args, *sets, "--set", "run.log_every=5", timeout=150)
    summary_file = run_dir / "summary.json"
    if done.returncode != 0 or not summary_file.is_file():
        return {"ok": False, "error": (done.stderr or done.stdout)[-1500:]}
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"ok": True, "summary": json.loads(summary_file.read_text()), "metrics": metrics}


def check_run(name: str, hook: str, scaler: bool, result: dict[str, Any]) -> tuple[str, str]:
    if not result["ok"]:
        return "FAIL", result["error"].splitlines()[-1] if result["error"] else "no summary"
    summary = result["summary"]
    ddp = summary.get("ddp", {})
    problems = []
    if not math.isfinite(summary.get("final_loss") or math.nan):
        problems.append(f"final loss {summary.get('final_loss')}")
    if ddp.get("comm_hook") != hook:
        problems.append(f"comm hook in effect {ddp.get('comm_hook')}, not {hook}")
    if bool(ddp.get("grad_scaler")) != scaler:
        problems.append(f"GradScaler {'missing' if scaler else 'unexpected'}")
    detail = (
        f"loss {summary.get('first_loss', 0):.3f} -> {summary.get('final_loss', 0):.3f}, hook {ddp.get('comm_hook')}"
    )
    return ("FAIL", "; ".join(problems)) if problems else ("PASS", detail)


def mfu(result: dict[str, Any], shape: dict[str, int], device: str, gpus: int) -> dict[str, Any]:
    peak = peak_bf16(device)
    rates = [m["tokens_per_s"] for m in result.get("metrics", []) if m.get("tokens_per_s")]
    if peak is None or not rates:
        return {"value": None, "reason": f"no peak for {device!r} in PEAK_BF16" if peak is None else "no tokens/s"}
    tokens_per_s = statistics.median(rates[len(rates) // 2 :])  # past warm-up
    achieved = tokens_per_s * flops_per_token(**shape)
    return {"value": round(achieved / (peak * gpus), 4), "tokens_per_s": tokens_per_s, "peak_bf16_per_gpu": peak}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(time.strftime("artifacts/gpu-check-%Y%m%d-%H%M%S")))
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False): run it on a machine with "
              "NVIDIA GPUs and a CUDA build of torch (the gpu image, container/)", file=sys.stderr)  # fmt: skip
        return 2
    gpus, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    rows = []
    sweep = torchrun(gpus, HERE / "bench_allreduce.py", "--backend", "nccl", "--max-bytes", "1G",
                     "--json", str(out / "allreduce.json"), timeout=150)  # fmt: skip
    allreduce = json.loads((out / "allreduce.json").read_text()) if sweep.returncode == 0 else {}
    best = max((r["busbw_gbps"] for r in allreduce.get("results", [])), default=None)
    rows.append(
        ("nccl allreduce", "PASS" if allreduce else "FAIL", f"best busbw {best} GB/s" if best else sweep.stderr[-300:])
    )
    runs = {}
    for name, overrides, hook, scaler in RUNS:
        runs[name] = training_run(gpus, out, name, overrides, args.steps)
        rows.append((f"train {name}", *check_run(name, hook, scaler, runs[name])))
    utilisation = mfu(runs["bf16"], transformer_shape(), device, gpus) if runs["bf16"]["ok"] else {"value": None}
    rows.append(("MFU (bf16 transformer)", "INFO", json.dumps(utilisation)))
    report = {"device": device, "gpus": gpus, "allreduce": allreduce, "mfu": utilisation, "checks": rows}
    report["runs"] = {name: run.get("summary") for name, run in runs.items()}
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{gpus} x {device}")
    for check, verdict, detail in rows:
        print(f"{verdict:<5} {check:<24} {detail}")
    return 0 if all(verdict in ("PASS", "INFO") for _, verdict, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
