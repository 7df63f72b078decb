"""`make doctor` on inventory/local (loopback), and its verdicts on measured numbers."""

import json
from pathlib import Path

import pytest
from _make import ARTIFACTS, make
from ddp_launcher import doctor


def newest_doctor_dir() -> Path:
    return sorted(ARTIFACTS.glob("doctor-*/doctor.json"))[-1].parent


def newest_doctor() -> dict:
    return json.loads((newest_doctor_dir() / "doctor.json").read_text())


@pytest.mark.slow
def test_doctor_on_this_machine_measures_the_loopback_pair_and_an_allreduce_sweep():
    done = make("doctor")
    # It completes with its table; whether every verdict passes depends on this machine's load.
    assert "doctor.json and report.md:" in done.stdout, done.stdout + done.stderr
    report = newest_doctor()
    checks = {v["check"]: v for v in report["verdicts"]}
    for check in ("python version", "torch version", "interfaces on localhost", "TCP localhost -> localhost"):
        assert check in checks, sorted(checks)
    assert report["pairs"][0]["iperf3"]["gbit_per_s"] > 0
    sizes = [r["size_bytes"] for r in report["allreduce"]["results"]]
    assert {1 << 20, 128 << 20} <= set(sizes)
    assert all(r["correct"] for r in report["allreduce"]["results"])
    assert {"allreduce 1M", "allreduce 128M", "allreduce busbw / link"} <= set(checks)
    assert "| PASS | allreduce 1M |" in (newest_doctor_dir() / "report.md").read_text()
    assert "PASS  python version" in done.stdout
    # Only a FAIL fails the command; a WARN (a slow link on a loaded machine, say) is advice.
    failed = sum(v["verdict"] == "FAIL" for v in report["verdicts"])
    warned = sum(v["verdict"] == "WARN" for v in report["verdicts"])
    assert (done.returncode != 0) == bool(failed), done.stdout  # make exits 2 when the command exits 1
    assert f"{failed} FAIL, {warned} WARN: {'not fit' if failed else 'fit'} to train" in done.stdout


@pytest.mark.slow
def test_doctor_names_a_gloo_interface_the_node_lacks():
    done = make("doctor", 'EXTRA_VARS={"train_env": {"GLOO_SOCKET_IFNAME": "eth9", "OMP_NUM_THREADS": "1"}}')
    assert done.returncode != 0
    assert "FAIL  interfaces on localhost" in done.stdout
    assert "GLOO_SOCKET_IFNAME=eth9 in train_env on localhost: no such interface" in done.stdout
    assert "not run: fix the interfaces named above first" in done.stdout


def test_the_large_allreduce_limit_scales_with_a_slow_link_only():
    assert doctor.large_limit_ms(None) == doctor.large_limit_ms(100.0) == 100.0
    assert doctor.large_limit_ms(1.0) == pytest.approx(1000.0)


def sweep(**times_ms):
    sizes = {"1M": 1 << 20, "128M": 128 << 20}
    return {
        "results": [
            {"size": name, "size_bytes": sizes[name], "time_us": ms * 1000, "busbw_gbps": 1.0, "correct": True}
            for name, ms in times_ms.items()
        ]
    }


def test_allreduce_verdicts_against_the_hand_checks():
    verdicts = {v.check: v for v in doctor.allreduce_verdicts(sweep(**{"1M": 4.0, "128M": 120.0}), link=10.0)}
    assert verdicts["allreduce 1M"].verdict == "PASS"
    assert verdicts["allreduce 128M"].verdict == "PASS"  # limit 128 ms: 100 ms for 100 MiB x 1.28
    assert verdicts["allreduce busbw / link"].verdict == "PASS"  # 1 GB/s of the link's 1.25 GB/s: 80%
    fast_link = {v.check: v for v in doctor.allreduce_verdicts(sweep(**{"128M": 50.0}), link=100.0)}
    assert fast_link["allreduce busbw / link"].verdict == "WARN"  # 1 GB/s of 12.5 GB/s: 8%
    slow = {v.check: v for v in doctor.allreduce_verdicts(sweep(**{"1M": 6.0, "128M": 200.0}), link=10.0)}
    assert slow["allreduce 1M"].verdict == slow["allreduce 128M"].verdict == "FAIL"
    slow_link = {v.check: v for v in doctor.allreduce_verdicts(sweep(**{"128M": 200.0}), link=1.0)}
    assert slow_link["allreduce 128M"].verdict == "PASS"
    assert "scaled from 100 ms at 10 Gbit/s to the measured 1.00 Gbit/s" in slow_link["allreduce 128M"].detail


@pytest.mark.parametrize(
    ("link_gbit", "shown", "verdict"),
    [(16.0, "50.0%", "PASS"), (16.0016, "50.0%", "PASS"), (16.04, "49.9%", "WARN"), (32.0, "25.0%", "WARN")],
)
def test_the_busbw_verdict_agrees_with_the_share_it_shows(link_gbit, shown, verdict):
    # busbw 1 GB/s against a link of link_gbit / 8 GB/s: 16 Gbit/s is exactly the expected half.
    found = {v.check: v for v in doctor.allreduce_verdicts(sweep(**{"128M": 50.0}), link=link_gbit)}
    share = found["allreduce busbw / link"]
    assert f"= {shown} of the slowest pair's" in share.detail and "(expected at least 50.0%)" in share.detail
    assert share.verdict == verdict, share.detail


def test_a_pair_that_times_out_is_named_as_blocked():
    pair = {"client": "a", "server": "b", "port": 51999, "iperf3": {"error": "unable to connect: Connection timed out"}}
    (verdict,) = doctor.pair_verdicts([pair])
    assert (verdict.check, verdict.verdict) == ("TCP a -> b", "FAIL")
    assert "blocked: firewall or routing?" in verdict.detail


def test_known_log_patterns_name_cause_and_fix(tmp_path):
    run = tmp_path / "job-1"
    (run / "logs" / "node1").mkdir(parents=True)
    (run / "run.json").write_text('{"status": "failed", "started": "2026-12-04T10:00:00"}')
    (run / "logs" / "node1" / "node.log").write_text("[E] NCCL WARN Connect timeout to 10.0.0.2\n")
    (verdict,) = doctor.log_verdicts(tmp_path)
    assert verdict.verdict == "WARN"
    assert "network or firewall between nodes" in verdict.detail
