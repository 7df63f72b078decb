"""train/bench_allreduce.py: sizes, bandwidth arithmetic, verdicts, and a 2-process gloo run on loopback."""

import json
import math

import bench_allreduce as bench
import pytest
from _train_helpers import BENCH, torchrun


def test_sizes_and_units():
    assert bench.parse_size("1K") == 1024
    assert bench.parse_size("256M") == 256 << 20
    assert bench.parse_size("1GiB") == 1 << 30
    assert bench.parse_size("4096") == 4096
    assert bench.sizes(1024, 1 << 20, 4) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert len(bench.sizes(1024, 256 << 20, 2)) == 19
    assert bench.human(3 << 20) == "3M" and bench.human(1536) == "1536B"


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert bench.bus_bandwidth(10.0, 2) == 10.0
    assert bench.bus_bandwidth(10.0, 8) == pytest.approx(17.5)


def test_thresholds_exact_interpolated_and_outside():
    seeds = [bench.parse_threshold(t) for t in bench.SEED_THRESHOLDS]
    assert bench.threshold_us(1 << 20, seeds) == (5000.0, False)
    assert bench.threshold_us(100 << 20, seeds) == (100000.0, False)
    limit, interpolated = bench.threshold_us(10 << 20, seeds)  # log-log: halfway in log(size)
    assert interpolated and limit == pytest.approx(math.sqrt(5000.0 * 100000.0))
    assert bench.threshold_us(512 << 10, seeds) == (None, False)
    assert bench.threshold_us(128 << 20, seeds) == (None, False)
    assert bench.verdict(4000, 5000.0, True) == "PASS"
    assert bench.verdict(6000, 5000.0, True) == "FAIL"
    assert bench.verdict(6000, None, True) == "-"
    assert bench.verdict(1, 5000.0, False) == "WRONG"


@pytest.mark.slow
def test_two_processes_on_loopback_print_the_table_and_write_json(tmp_path):
    out = tmp_path / "bench.json"
    result = torchrun(
        BENCH, "--min-bytes", "1K", "--max-bytes", "1M", "--factor", "4", "--iters", "5", "--json", out, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "busbw" in line and "verdict" in line)
    assert header.split()[:2] == ["size", "count"]
    rows = [line for line in lines if line.strip() and not line.startswith("#") and line is not header]
    assert len(rows) == 6  # 1K 4K 16K 64K 256K 1M, printed once (rank 0 only)
    report = json.loads(out.read_text())
    assert (report["world_size"], report["backend"], len(report["results"])) == (2, "gloo", 6)
    n = report["world_size"]
    for r in report["results"]:
        assert r["correct"] and r["time_us"] > 0 and r["count"] == r["size_bytes"] // 4
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (n - 1) / n)
    one_mib = report["results"][-1]
    assert one_mib["size_bytes"] == 1 << 20 and one_mib["verdict"] in ("PASS", "FAIL")
    assert one_mib["verdict"] in rows[-1]
    assert [r["verdict"] for r in report["results"][:-1]] == ["-"] * 5
