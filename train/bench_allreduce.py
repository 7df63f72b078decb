"""Allreduce bandwidth benchmark in the manner of nccl-tests' all_reduce_perf; run it with torchrun.

    torchrun --standalone --nproc_per_node=2 train/bench_allreduce.py [--min-bytes 1K] [--max-bytes 256M]
        [--factor 2] [--warmup 5] [--iters 50] [--min-iters 2] [--time-budget-s 1.0] [--dtype float32]
        [--backend auto|nccl|gloo] [--threshold 1M:5 --threshold 100M:100] [--json PATH] [--strict]

Across nodes it needs nothing but torchrun's environment (env://): run the same command on every node with
--nnodes/--node-rank/--rdzv-endpoint. Backend auto: nccl when CUDA is available, else gloo.

For each size from --min-bytes to --max-bytes (multiplied by --factor), every rank runs one warm-up allreduce
(which also estimates its cost), more warm-up up to --warmup within half of --time-budget-s, then
min(--iters, max(--min-iters, budget / estimate)) timed allreduces back to back; so large sizes get fewer
iterations. time_us is the slowest rank's mean time per allreduce; algbw = bytes / time; busbw = algbw *
2(n-1)/n (the bandwidth each link needs in a ring; comparable across world sizes); GB = 1e9 bytes.
After timing, the result is checked (every rank adds rank+1; each element must equal n(n+1)/2).

Verdict: PASS/FAIL against a time threshold. The seed thresholds are 1 MiB in under 5 ms and 100 MiB in
under 100 ms (--threshold SIZE:MS, repeatable, replaces them). Between two thresholds the limit is
interpolated linearly in log(size)-log(time); outside the thresholds' range the verdict is '-'. A wrong
result is WRONG and always exits 1; --strict also exits 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_train.distributed import DistInfo, Terminated, install_signal_handlers, print0, print_all, process_group

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
SEED_THRESHOLDS = ["1M:5", "100M:100"]


def parse_size(text: str) -> int:
    """'1K', '256M', '1G', '4096' -> bytes (binary units)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in UNITS else ""
    try:
        value = int(float(text[: len(text) - len(unit)]) * UNITS[unit])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1K, 256M, 1G)") from exc
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def parse_threshold(text: str) -> tuple[int, float]:
    size, sep, ms = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"threshold {text!r}: expected SIZE:MILLISECONDS, e.g. 1M:5")
    try:
        return parse_size(size), float(ms) * 1000.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"threshold {text!r}: {exc}") from exc


def human(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return f"{size}B"


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' allreduce bus bandwidth: algbw * 2(n-1)/n."""
    return algbw * 2 * (world_size - 1) / world_size


def threshold_us(size: int, thresholds: list[tuple[int, float]]) -> tuple[float | None, bool]:
    """(time limit in us, interpolated?) for size; (None, False) outside the thresholds' range."""
    points = sorted(thresholds)
    for s, limit in points:
        if s == size:
            return limit, False
    for (s0, t0), (s1, t1) in itertools.pairwise(points):
        if s0 < size < s1:
            frac = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + frac * math.log(t1 / t0)), True
    return None, False


def verdict(time_us: float, limit_us: float | None, correct: bool) -> str:
    if not correct:
        return "WRONG"
    if limit_us is None:
        return "-"
    return "PASS" if time_us < limit_us else "FAIL"


def _sync(info: DistInfo) -> None:
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)


def timed(tensor: torch.Tensor, iters: int, info: DistInfo) -> float:
    """Seconds per allreduce, the slowest rank's (so every rank gets the same number)."""
    dist.barrier()
    _sync(info)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    _sync(info)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=info.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def check(tensor: torch.Tensor, info: DistInfo) -> bool:
    tensor.fill_(info.rank + 1)
    dist.all_reduce(tensor)
    n = info.world_size
    ok = torch.tensor([int(bool((tensor == n * (n + 1) // 2).all()))], device=info.device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def bench_size(size: int, args: argparse.Namespace, info: DistInfo) -> dict:
    dtype = DTYPES[args.dtype]
    count = max(1, size // dtype.itemsize)
    tensor = torch.zeros(count, dtype=dtype, device=info.device)
    estimate = timed(tensor, 1, info)  # first warm-up
    extra = min(args.warmup - 1, int(args.time_budget_s / 2 / max(estimate, 1e-9)))
    if extra > 0:
        timed(tensor, extra, info)
    iters = max(args.min_iters, min(args.iters, int(args.time_budget_s / max(estimate, 1e-9))))
    seconds = timed(tensor, iters, info)
    correct = check(tensor, info)
    nbytes = count * dtype.itemsize
    algbw = nbytes / seconds / 1e9
    limit, interpolated = threshold_us(nbytes, args.threshold)
    return {
        "size_bytes": nbytes,
        "size": human(nbytes),
        "count": count,
        "dtype": args.dtype,
        "iters": iters,
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": bus_bandwidth(algbw, info.world_size),
        "threshold_us": limit,
        "threshold_interpolated": interpolated,
        "correct": correct,
        "verdict": verdict(seconds * 1e6, limit, correct),
    }


HEADER = (
    f"{'size':>12} {'':>6} {'count':>11} {'type':>8} {'iters':>5} {'time_us':>11} "
    f"{'algbw':>8} {'busbw':>8} {'limit_us':>9}  verdict"
)


def row(r: dict) -> str:
    limit = "-" if r["threshold_us"] is None else f"{r['threshold_us']:.0f}{'*' if r['threshold_interpolated'] else ''}"
    return (
        f"{r['size_bytes']:>12} {r['size']:>6} {r['count']:>11} {r['dtype']:>8} {r['iters']:>5} "
        f"{r['time_us']:>11.1f} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} {limit:>9}  {r['verdict']}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"))
    p.add_argument("--factor", type=int, default=2, help="size multiplier between steps (>= 2)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up allreduces per size (at most)")
    p.add_argument("--iters", type=int, default=50, help="timed allreduces per size (at most)")
    p.add_argument("--min-iters", type=int, default=2, help="timed allreduces per size (at least)")
    p.add_argument("--time-budget-s", type=float, default=1.0, help="timed seconds per size that set iters")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--threshold", type=parse_threshold, action="append", metavar="SIZE:MS")
    p.add_argument("--json", type=Path, help="write the results here (rank 0)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any size FAILs its threshold")
    args = p.parse_args(argv)
    args.threshold = args.threshold or [parse_threshold(t) for t in SEED_THRESHOLDS]
    if args.factor < 2 or args.min_bytes > args.max_bytes or args.warmup < 1 or args.min_iters < 1:
        p.error("need --factor >= 2, --min-bytes <= --max-bytes, --warmup >= 1, --min-iters >= 1")
    args.iters = max(args.iters, args.min_iters)
    return args


def run(args: argparse.Namespace, info: DistInfo) -> list[dict]:
    print0(
        f"# allreduce: world {info.world_size}, backend {info.backend}, device {info.device.type}, "
        f"dtype {args.dtype}; time = slowest rank's mean; GB/s = 1e9 B/s; busbw = algbw*2(n-1)/n"
    )
    print0("# limit_us: * = interpolated (log-log) between thresholds; '-' = outside them")
    print0(HEADER)
    results = []
    for size in sizes(args.min_bytes, args.max_bytes, args.factor):
        results.append(bench_size(size, args, info))
        print0(row(results[-1]))
    avg = sum(r["busbw_gbps"] for r in results) / len(results)
    print0(f"# avg busbw {avg:.3f} GB/s (algbw, busbw in GB/s)")
    if args.json and info.is_main:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "world_size": info.world_size,
            "backend": info.backend,
            "device": info.device.type,
            "dtype": args.dtype,
            "thresholds_us": [{"size_bytes": s, "time_us": t} for s, t in sorted(args.threshold)],
            "verdict_rule": "PASS if time_us < limit; limit log-log interpolated between thresholds, '-' outside",
            "avg_busbw_gbps": avg,
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    try:
        with process_group(args.backend, args.timeout_s) as info:
            results = run(args, info)
    except Terminated as exc:
        print_all(f"stopping: {exc}")
        return 128 + exc.signum
    except Exception as exc:
        print_all(f"benchmark failed: {type(exc).__name__}: {exc}")
        return 1
    verdicts = {r["verdict"] for r in results}
    return 1 if "WRONG" in verdicts or (args.strict and "FAIL" in verdicts) else 0


if __name__ == "__main__":
    code = main()
    # As train.py: no interpreter finalization for gloo's threads to abort in (pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
