"""make bench's ratios from measured numbers (the whole bench runs by hand: README "Performance")."""

import json
from pathlib import Path

import pytest
from ddp_launcher import bench

ROOT = Path(__file__).resolve().parents[2]


def test_p1_is_busbw_at_64_mib_over_the_slowest_pairs_bandwidth():
    examined = {"pairs": [{"iperf3": {"gbit_per_s": 8.0}}, {"iperf3": {"gbit_per_s": 16.0}}]}
    sweep = {"world_size": 2, "results": [{"size_bytes": 64 << 20, "busbw_gbps": 0.5}]}
    assert bench.p1(examined, sweep)["value"] == 0.5  # 0.5 GB/s over 8 Gbit/s = 1 GB/s
    missing = bench.p1({"pairs": []}, sweep)
    assert missing["value"] is None and missing["reason"]


def test_p2_and_p3_are_null_with_a_reason_where_they_cannot_be_measured():
    one_node = bench.p2(["localhost"], "inventory/local", ROOT / "artifacts", "bench-x")
    assert one_node["value"] is None and "one training node" in one_node["reason"]
    assert bench.p3(None)["value"] is None and "site.yml" in bench.p3(None)["reason"]
    measured = bench.p3([400.0, 100.0, 0.0])
    assert (measured["value"], measured["rerun_changed"]) == (0.25, 0)


def test_only_p3_writes_every_key_with_a_reason_for_each_figure_it_skipped(tmp_path, capsys):
    assert bench.main(["--only", "p3", "--site-seconds", "400", "100", "0", "--artifacts", str(tmp_path)]) == 0
    written = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    assert written["p3_noop_rerun_over_converge"] == {
        "value": 0.25,
        "converge_s": 400.0,
        "rerun_s": 100.0,
        "rerun_changed": 0,
    }
    for key in ("p1_allreduce_busbw_over_link", "p2_scaling_efficiency", "p4_checkpoint_stall_fraction"):
        assert written[key]["value"] is None and "--only p3" in written[key]["reason"]
    assert "p3_noop_rerun_over_converge        0.250" in capsys.readouterr().out


def test_p6lab_is_the_launch_s_time_around_the_training_over_the_training(tmp_path, capsys):
    run = tmp_path / "lab-job-20261206-010203-beef"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "summary.json").write_text(json.dumps({"wall_time_s": 80.0, "last_step": 30}))
    argv = ["--only", "p6lab", "--launch-seconds", "200", "--run-dir", str(run), "--artifacts", str(tmp_path)]
    assert bench.main(argv) == 0
    written = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    assert written["p6_lab_overhead_over_training"] == {
        "value": 1.5,  # (200 - 80) / 80
        "launch_s": 200.0,
        "training_s": 80.0,
        "overhead_s": 120.0,
        "steps": 30,
        "run": run.name,
    }
    assert "p6_lab_overhead_over_training      1.500" in capsys.readouterr().out
    assert bench.p6_lab(None, None)["value"] is None and "e2e" in bench.p6_lab(None, None)["reason"]


@pytest.mark.slow
def test_p7_and_p8_time_a_cached_environment_and_an_unchanged_dataset_on_inventory_local(tmp_path, capsys):
    args = ["--only", "p7", "p8", "--data-files", "20", "--p7-pairs", "1", "--artifacts", str(tmp_path)]
    assert bench.main(args) == 0
    written = json.loads(next(tmp_path.glob("bench-*/bench.json")).read_text())
    env = written["p7_env_cache_hit_overhead_s"]
    assert env["value"] == round(min(env["launch_hit_s"]) - min(env["launch_plain_s"]), 2), env
    assert len(env["launch_hit_s"]) == len(env["launch_plain_s"]) == 1
    assert all(0 < tasks < 5 for tasks in env["hit_env_tasks_s"]) and len(env["hit_env_tasks_s"]) == 1, env
    # The hits found the environment the miss made, and the plain launches had none.
    records = {
        int(path.parent.name.rsplit("-", 1)[1]): json.loads(path.read_text())
        for path in tmp_path.glob("bench-*-p7-*/run.json")
    }
    assert [bool(records[n]["env"]) for n in sorted(records)] == [True, False, True]
    assert len({records[n]["env"]["key"] for n in (0, 2)}) == 1
    data = written["p8_data_resync_s"]
    assert (data["files"], data["bytes"]) == (20, 20 << 20)
    assert 0 < data["value"] < 10 and data["first_sync_s"] > 0, data
    resynced = json.loads(next(tmp_path.glob("bench-*-p8-1/run.json")).read_text())["data"]
    assert (resynced["files"], resynced["sent_files"]) == (20, 0)
    printed = capsys.readouterr().out
    assert f"p7_env_cache_hit_overhead_s {env['value']:>12.3f}" in printed, printed
