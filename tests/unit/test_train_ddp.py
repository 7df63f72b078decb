"""2-process gloo runs of train/train.py under torchrun: learning, exact resume, damaged checkpoints,
every comm hook and precision mode, SIGTERM.

The resume scenario shares its runs (module fixture): an uninterrupted 40-step run; a 20-step run (checkpoints
at 10 and 20) resumed to 40; and a copy of that 20-step run whose newest checkpoint is then truncated.
"""

import shutil
import signal
import socket
import time

import pytest
import torch
from _train_helpers import SMOKE, TRAIN, kill_all, metrics, start, summary, torchrun_cmd, train
from ddp_train.config import Config, load_config

pytestmark = pytest.mark.slow

STEPS = 40
COMMON = ("--checkpoint-every", "10", "--seed", "3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    dirs = {name: base / name for name in ("whole", "part", "damaged")}
    out = {"whole": train("--max-steps", str(STEPS), "--checkpoint-dir", dirs["whole"], "--keep-last", "2", *COMMON)}
    out["part1"] = train("--max-steps", "20", "--checkpoint-dir", dirs["part"], *COMMON)
    shutil.copytree(dirs["part"], dirs["damaged"])
    out["part2"] = train(
        "--max-steps", str(STEPS), "--checkpoint-dir", dirs["part"], "--output-dir", base / "part2", *COMMON
    )
    newest = dirs["damaged"] / "ckpt-00000020.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])  # a crash mid-copy, say
    out["damaged"] = train(
        "--max-steps", "12", "--checkpoint-dir", dirs["damaged"], "--output-dir", base / "damaged-out", *COMMON
    )
    return base, out


def params(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_loss_falls_and_the_run_reports_itself(runs):
    base, out = runs
    records = metrics(base / "whole")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    first, last = (sum(r["loss"] for r in part) / 3 for part in (records[:3], records[-3:]))
    assert last < 0.6 * first, (first, last)
    for key in ("epoch", "samples_per_s", "step_time_s", "comm_time_s", "peak_mem_bytes", "accuracy", "lr"):
        assert records[-1][key] is not None, key
    # The log steps (and only they) carry each node's slowest rank's times, gathered from every rank.
    timed = [r for r in records if "node_step_time_s" in r]
    assert {r["step"] for r in timed} >= {1, STEPS} and len(timed) < len(records)
    # The host's slowest rank: at least rank 0's own time, which is among them.
    assert all(r["node_step_time_s"][socket.gethostname()] >= r["step_time_s"] > 0 for r in timed)
    assert all(set(r["node_comm_time_s"]) == {socket.gethostname()} for r in timed)
    s = summary(base / "whole")
    assert (s["status"], s["steps"], s["first_step"], s["last_step"], s["world_size"], s["backend"]) == (
        "completed",
        STEPS,
        1,
        STEPS,
        2,
        "gloo",
    )
    assert s["resumed_from_step"] is None and s["final_loss"] < s["first_loss"]
    assert s["eval_accuracy"] > 0.5 and s["mean_samples_per_s"] > 0
    assert s["ddp"] == configured_ddp(load_config(SMOKE), "gloo")
    assert "step 40/40" in out["whole"].stdout  # progress line on rank 0 only
    assert out["whole"].stdout.count("step 40/40") == 1


def test_keep_last_leaves_the_newest_two_and_no_temp_files(runs):
    base, _ = runs
    names = sorted(p.name for p in (base / "whole").iterdir())
    assert names == [
        "checkpoints.jsonl",
        "ckpt-00000030.pt",
        "ckpt-00000030.pt.sha256",
        "ckpt-00000040.pt",
        "ckpt-00000040.pt.sha256",
        "metrics.jsonl",
        "summary.json",
    ]


def test_resumed_run_continues_at_the_next_step_and_matches_an_uninterrupted_run(runs):
    base, out = runs
    assert "resuming from" in out["part2"].stdout and "ckpt-00000020.pt (step 20)" in out["part2"].stdout
    resumed = metrics(base / "part2")
    assert resumed[0]["step"] == 21 and resumed[-1]["step"] == STEPS
    assert summary(base / "part2")["resumed_from_step"] == 20
    whole, part = params(base / "whole" / "ckpt-00000040.pt"), params(base / "part" / "ckpt-00000040.pt")
    assert whole.keys() == part.keys()
    for key in whole:
        torch.testing.assert_close(part[key], whole[key], atol=1e-6, rtol=0, msg=key)
    # the same data in the same order: the per-step losses agree too
    reference = {r["step"]: r["loss"] for r in metrics(base / "whole")}
    for record in resumed:
        assert record["loss"] == pytest.approx(reference[record["step"]], abs=1e-6)


def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(runs):
    base, out = runs
    result = out["damaged"]
    assert "WARNING: skipping checkpoint of step 20" in result.stderr
    assert "ckpt-00000010.pt (step 10)" in result.stdout
    assert metrics(base / "damaged-out")[0]["step"] == 11
    assert summary(base / "damaged-out")["resumed_from_step"] == 10


# Each hook x precision case also switches on other options, so the 2-process runs cover them without more
# torchrun start-ups (each costs a few seconds of torch import).
CASES = {
    ("none", "bf16"): ["optim.zero=true", "optim.name=adamw", "optim.lr=0.003"],
    ("fp16", "off"): ["run.grad_accum_steps=2", "optim.lr_scaling=linear", "optim.base_batch_size=64"],
    ("fp16", "bf16"): ["model.activation_checkpointing=true", "ddp.static_graph=true"],
    ("bf16", "off"): ["ddp.gradient_as_bucket_view=false", "ddp.find_unused_parameters=true", "optim.grad_clip=1"],
    ("bf16", "bf16"): ["optim.schedule=cosine", "data.dataset=synthetic", "data.image_size=8", "data.num_samples=256"],
    ("powersgd", "off"): ["ddp.bucket_cap_mb=0.01", "model.blocks_per_stage=2"],
    ("powersgd", "bf16"): [
        "model.name=transformer_lm",
        "data.dataset=synthetic_tokens",
        "data.seq_len=16",
        "data.vocab_size=32",
        "model.d_model=32",
        "model.d_ff=64",
        "optim.name=adamw",
        "optim.lr=0.003",
    ],
}


HOOK_FUNCTIONS = {
    "none": "allreduce_hook",  # registered, on gloo, to time DDP's own allreduce
    "fp16": "fp16_compress_hook",
    "bf16": "bf16_compress_hook",
    "powersgd": "powerSGD_hook",
}


def configured_ddp(cfg: Config, backend: str) -> dict:
    """What summary.json's `ddp` (read back from the DDP object) must say for this config."""
    ddp = cfg.ddp
    # comm hook none: DDP's built-in allreduce, unless a hook is registered to time it (gloo)
    registered = ddp.comm_hook != "none" or (cfg.metrics.measure_comm and backend == "gloo")
    expected = {
        "comm_hook": HOOK_FUNCTIONS[ddp.comm_hook] if registered else None,
        "comm_hook_timed": registered,
        "static_graph": ddp.static_graph,
        "bucket_cap_mb": ddp.bucket_cap_mb,
        "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
        "find_unused_parameters": ddp.find_unused_parameters,
        "broadcast_buffers": ddp.broadcast_buffers,
        "zero": cfg.optim.zero,
        "optimizer": {"sgd": "SGD", "adamw": "AdamW"}[cfg.optim.name],
        "activation_checkpointing": cfg.model.activation_checkpointing,
        "grad_scaler": cfg.precision.mode == "fp16",
    }
    if ddp.comm_hook == "powersgd":
        expected |= {"powersgd_rank": ddp.powersgd_rank, "powersgd_start_iter": ddp.powersgd_start_iter}
    return expected


@pytest.mark.parametrize("precision", ["off", "bf16", "fp16"])
@pytest.mark.parametrize("hook", ["none", "fp16", "bf16", "powersgd"])
def test_comm_hook_and_precision_train_two_processes(tmp_path, hook, precision):
    if precision == "fp16" and not torch.cuda.is_available():
        pytest.skip("fp16 GradScaler needs CUDA")
    if (hook, precision) == ("none", "off"):
        pytest.skip("covered by the smoke runs above")
    extra = CASES.get((hook, precision), [])
    sets = [f"ddp.comm_hook={hook}", f"precision.mode={precision}", "ddp.powersgd_start_iter=2", *extra]
    train(
        "--max-steps",
        "4",
        "--checkpoint-dir",
        tmp_path,
        "--checkpoint-every",
        "2",
        *(arg for s in sets for arg in ("--set", s)),
    )
    records = metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    s = summary(tmp_path)
    assert s["status"] == "completed"
    expected = configured_ddp(load_config(SMOKE, sets), s["backend"])
    assert s["ddp"] == expected, "a configured DDP option or comm hook is not in effect"
    assert (tmp_path / "ckpt-00000004.pt").is_file()


def test_sigterm_stops_every_rank_cleanly(tmp_path):
    cmd = torchrun_cmd(
        TRAIN, "--config", SMOKE, "--max-steps", "100000", "--checkpoint-dir", tmp_path, "--checkpoint-every", "0"
    )
    proc = start(cmd)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            jsonl = tmp_path / "metrics.jsonl"
            if jsonl.exists() and len(jsonl.read_text().splitlines()) >= 3:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # what torchrun's own stop, or the launcher's, sends
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_all(proc)
    assert proc.returncode != 0
    for rank in (0, 1):
        assert f"[rank {rank}] stopping: received SIGTERM; process group destroyed" in stderr, stderr
    assert summary(tmp_path)["status"] == "terminated"


def test_every_rank_reports_the_step_it_reached_for_the_hang_check(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_PROGRESS_DIR", str(tmp_path))
    train("--max-steps", "3", "--output-dir", tmp_path / "out")
    assert {path.name: path.read_text() for path in tmp_path.glob("rank-*")} == {"rank-0": "3\n", "rank-1": "3\n"}
