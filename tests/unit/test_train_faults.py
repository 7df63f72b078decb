"""Faults during a run of train.py under torchrun (2 gloo processes): the writer killed while it saves."""

from pathlib import Path

import pytest
from _train_helpers import SMOKE, metrics, torchrun, train

pytestmark = pytest.mark.slow

KILLER = Path(__file__).with_name("_kill_in_save.py")


def test_writer_killed_during_a_save_keeps_the_previous_checkpoint_and_resume_uses_it(tmp_path, monkeypatch):
    ckpt_dir, common = tmp_path / "ckpt", ("--checkpoint-every", "10", "--seed", "3")
    monkeypatch.setenv("DDP_TEST_KILL_AT_STEP", "20")
    killed = torchrun(KILLER, "--config", str(SMOKE), "--max-steps", "30", "--checkpoint-dir", ckpt_dir, *common)
    monkeypatch.delenv("DDP_TEST_KILL_AT_STEP")
    assert killed.returncode != 0
    assert "SIGKILL" in killed.stderr
    left = sorted(p.name for p in ckpt_dir.iterdir())
    assert "ckpt-00000010.pt" in left and "ckpt-00000020.pt" not in left, left
    assert any(name.endswith(".tmp") for name in left), f"the kill came before any byte was written: {left}"

    out = tmp_path / "resumed"
    train("--max-steps", "30", "--checkpoint-dir", ckpt_dir, "--output-dir", out, "--resume", "auto", *common)
    assert metrics(out)[0]["step"] == 11, "resume did not start from the last complete checkpoint (step 10)"
    assert metrics(out)[-1]["step"] == 30
    assert not [p for p in ckpt_dir.iterdir() if p.suffix == ".tmp"], "the stale temp file was not cleaned up"
