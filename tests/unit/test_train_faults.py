"""Faults during a run of train.py under torchrun (2 gloo processes): the writer killed while it saves."""

import json
from pathlib import Path

import pytest
from _train_helpers import SMOKE, metrics, summary, torchrun, train
from ddp_train import checkpoint as ckpt

pytestmark = pytest.mark.slow

KILLER = Path(__file__).with_name("_kill_in_save.py")


@pytest.mark.parametrize("staged", [False, True], ids=["blocking", "async"])
def test_writer_killed_during_a_save_keeps_the_previous_checkpoint_and_resume_uses_it(tmp_path, monkeypatch, staged):
    ckpt_dir, common = tmp_path / "ckpt", ("--checkpoint-every", "10", "--seed", "3")
    monkeypatch.setenv("DDP_TEST_KILL_AT_STEP", "20")
    if staged:  # the write of step 20 holds, part-way, until training has reached step 23
        monkeypatch.setenv("DDP_TEST_KILL_AFTER_STEP", "23")
    mode = ("--set", f"checkpoint.async={json.dumps(staged)}")
    killed = torchrun(KILLER, "--config", str(SMOKE), "--max-steps", "30", "--checkpoint-dir", ckpt_dir, *mode, *common)
    monkeypatch.delenv("DDP_TEST_KILL_AT_STEP")
    monkeypatch.delenv("DDP_TEST_KILL_AFTER_STEP", raising=False)
    assert killed.returncode != 0
    assert "SIGKILL" in killed.stderr
    assert "never came" not in killed.stderr
    left = sorted(p.name for p in ckpt_dir.iterdir())
    assert "ckpt-00000010.pt" in left and "ckpt-00000020.pt" not in left, left
    assert any(name.endswith(".tmp") for name in left), f"the kill came before any byte was written: {left}"
    last_trained = metrics(ckpt_dir)[-1]["step"]
    if staged:
        assert last_trained >= 23, "training did not go on while the checkpoint was written in the background"
    else:
        assert last_trained == 20, "training went on during a blocking save"
    completed = [json.loads(line)["step"] for line in (ckpt_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert completed == [10], "a checkpoint was reported before its file was complete"
    assert ckpt.load_checkpoint(ckpt_dir / "ckpt-00000010.pt")["step"] == 10  # whole: its SHA-256 verifies

    out = tmp_path / "resumed"
    train("--max-steps", "30", "--checkpoint-dir", ckpt_dir, "--output-dir", out, "--resume", "auto", *common)
    assert metrics(out)[0]["step"] == 11, "resume did not start from the last complete checkpoint (step 10)"
    assert metrics(out)[-1]["step"] == 30
    assert summary(out)["resumed_from_step"] == 10
    assert not [p for p in ckpt_dir.iterdir() if p.suffix == ".tmp"], "the stale temp file was not cleaned up"
