"""ddp_train/metrics.py and the small decisions in ddp_train/main.py, in one process."""

import json

import pytest
from ddp_train import main as train_main
from ddp_train.config import load_config
from ddp_train.metrics import CommTimer, MetricsLog, RunStats, progress_line


def test_comm_time_is_the_union_of_in_flight_intervals():
    timer = CommTimer()
    timer._intervals = [(0.0, 1.0), (0.5, 1.5), (3.0, 4.0), (3.2, 3.4)]
    assert timer.take() == pytest.approx(2.5)
    assert timer.take() == 0.0


def test_run_stats_exclude_the_first_step_from_throughput():
    stats = RunStats(resumed_from_step=20)
    stats.add(21, 2.0, 64, 10.0)  # warm-up step: slow, not counted
    stats.add(22, 1.5, 64, 0.5)
    stats.add(23, 1.0, 64, 0.5)
    d = stats.as_dict()
    assert (d["steps"], d["first_step"], d["last_step"], d["first_loss"], d["final_loss"]) == (3, 21, 23, 2.0, 1.0)
    assert d["mean_samples_per_s"] == 128.0 and d["resumed_from_step"] == 20


def test_metrics_log_writes_jsonl_and_summary_and_warns_without_tensorboard(tmp_path):
    warnings = []
    log = MetricsLog(tmp_path, enabled=True, tensorboard=True, warn=warnings.append)
    log.open(resumed_from=None)
    log.step({"step": 1, "loss": 2.0})
    log.step({"step": 2, "loss": 1.0})
    log.summary({"steps": 2})
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"steps": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints.jsonl", "metrics.jsonl", "summary.json"]
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        assert len(warnings) == 1 and "TensorBoard is unavailable" in warnings[0]


def test_metrics_log_is_silent_off_rank_0(tmp_path):
    log = MetricsLog(tmp_path / "out", enabled=False, tensorboard=False, warn=print)
    log.open(resumed_from=None)
    log.step({"step": 1})
    log.summary({})
    assert not (tmp_path / "out").exists()


def test_metrics_keep_the_lineage_being_trained(tmp_path):
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(1, 8)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 8, "lo')  # crashed mid-line
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (5, 7)))
    log = MetricsLog(tmp_path, enabled=True, tensorboard=False, warn=print)
    log.open(resumed_from=5)  # resumed from the checkpoint of step 5: steps 6, 7 are redone
    log.step({"step": 6, "loss": 0.5})
    log.checkpoint({"step": 6, "ckpt_block_s": 0.1})
    log.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert [json.loads(x)["step"] for x in (tmp_path / "checkpoints.jsonl").read_text().splitlines()] == [5, 6]
    log.open(resumed_from=None)  # a fresh start
    log.close()
    assert (tmp_path / "metrics.jsonl").read_text() == (tmp_path / "checkpoints.jsonl").read_text() == ""


def test_progress_line():
    record = {"step": 5, "epoch": 0, "loss": 1.23456, "accuracy": 0.5, "samples_per_s": 1000.4, "lr": 0.1}
    line = progress_line(record | {"comm_time_s": 0.002, "eval_loss": 1.0, "eval_accuracy": 0.75}, 10)
    assert line == (
        "step 5/10 | epoch 0 | loss 1.2346 | acc 0.500 | 1000 samples/s | lr 0.1 | comm 2.0 ms"
        " | eval loss 1.0000 acc 0.750"
    )


def test_target_step_absolute_relative_and_across_a_torchrun_restart():
    absolute = load_config(None, ["run.max_steps=100"])
    relative = load_config(None, ["run.steps=30"])
    saved = {"extra": {"run_id": "run-1", "target_step": 50}}
    assert train_main.target_step(absolute, 20, saved, "run-1") == 100
    assert train_main.target_step(relative, 20, None, "run-1") == 50  # 30 on top of step 20
    assert train_main.target_step(relative, 40, saved, "run-1") == 50  # a restart keeps its target
    assert train_main.target_step(relative, 40, saved, "run-2") == 70  # a new invocation trains 30 more
    assert train_main.target_step(relative, 40, saved, "none") == 70  # torchrun's default id says nothing


def test_cli_flags_become_config_keys():
    args = train_main.parse_args(
        ["--max-steps", "7", "--checkpoint-dir", "runs/x y", "--resume", "never", "--set", "optim.lr=0.2"]
    )
    cfg = train_main.config_from_args(args)
    assert (cfg.run.max_steps, cfg.checkpoint.dir, cfg.checkpoint.resume, cfg.optim.lr) == (7, "runs/x y", "never", 0.2)
    assert cfg.data.dataset == "digits"  # the default config: cpu-smoke.yaml beside train.py
