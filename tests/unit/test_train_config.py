"""ddp_train/config.py: typed, validated configuration; train.py refuses a bad one before any process group."""

import json
import subprocess
import sys

import pytest
import yaml
from _train_helpers import ROOT, SMOKE, TRAIN, env, torchrun
from ddp_train.config import Config, ConfigError, load_config  # train/ (put on sys.path by train_helpers)


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_every_shipped_config_loads():
    for path in sorted((ROOT / "train" / "configs").glob("*.yaml")):
        assert isinstance(load_config(path), Config), path


def test_smoke_config_values():
    cfg = load_config(SMOKE)
    assert (cfg.data.dataset, cfg.model.name, cfg.precision.mode, cfg.data.num_workers) == (
        "digits",
        "small_cnn",
        "off",
        0,
    )


def test_unknown_key_names_the_key_and_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr' \(did you mean 'lr'\?\)"):
        load_config(write(tmp_path, "optim:\n  lrr: 0.1\n"))


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'trainer'"):
        load_config(write(tmp_path, "trainer: {}\n"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optim:\n  lr: -1\n", "optim.lr must be > 0, got -1"),
        ("optim:\n  lr: fast\n", "optim.lr: expected a number, got 'fast'"),
        ("run:\n  max_steps: 2.5\n", "run.max_steps: expected an integer, got 2.5"),
        ("ddp:\n  comm_hook: int8\n", "ddp.comm_hook: 'int8' is not one of none, fp16, bf16, powersgd"),
        ("ddp:\n  static_graph: 1\n", "ddp.static_graph: expected true or false, got 1"),
        ("ddp:\n  powersgd_start_iter: 1\n", "ddp.powersgd_start_iter must be >= 2"),
        ("data:\n  persistent_workers: true\n", "persistent_workers=true needs data.num_workers > 0"),
        ("data:\n  dataset: folder\n", "data.root is required for data.dataset=folder"),
        ("model:\n  name: transformer_lm\n", "model.name=transformer_lm does not fit data.dataset=digits"),
        ("model:\n  d_model: 30\n  n_heads: 4\n", "must be divisible by model.n_heads"),
        ("optim:\n  betas: [0.9]\n", "optim.betas: expected a list of 2 values"),
        ("run: 3\n", "run: expected a mapping"),
        ("checkpoint:\n  async: yes please\n", "checkpoint.async: expected true or false, got 'yes please'"),
        ("checkpoint:\n  async_: false\n", "unknown key 'checkpoint.async_'"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(write(tmp_path, text))


def test_bare_off_in_yaml_means_off(tmp_path):
    # YAML 1.1 reads `off` as false; the precision mode still means "off".
    assert load_config(write(tmp_path, "precision:\n  mode: off\n")).precision.mode == "off"


def test_overrides_parse_yaml_values():
    cfg = load_config(SMOKE, ["optim.lr=0.5", "ddp.comm_hook=fp16", "checkpoint.dir=runs/x", "run.steps=null"])
    assert (cfg.optim.lr, cfg.ddp.comm_hook, cfg.checkpoint.dir, cfg.run.steps) == (0.5, "fp16", "runs/x", None)
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.nope'"):
        load_config(SMOKE, ["optim.nope=1"])
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_config(SMOKE, ["optim.lr"])


def test_checkpoint_async_is_spelled_async_in_yaml_and_on_by_default(tmp_path):
    assert load_config(None).checkpoint.async_ is True
    cfg = load_config(write(tmp_path, "checkpoint:\n  async: false\n"), [])
    assert cfg.checkpoint.async_ is False and cfg.to_dict()["checkpoint"]["async"] is False
    assert load_config(None, ["checkpoint.async=false"]).checkpoint.async_ is False


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_config_round_trips_through_yaml():
    cfg = load_config(SMOKE)
    dumped = yaml.safe_load(yaml.safe_dump(json.loads(json.dumps(cfg.to_dict()))))
    again = load_config(None, [f"{s}.{k}={json.dumps(v)}" for s, d in dumped.items() for k, v in d.items()])
    assert again == cfg


def test_train_py_exits_2_with_the_message_without_torchrun(tmp_path):
    bad = write(tmp_path, "optim:\n  lrr: 0.1\n")
    result = subprocess.run(
        [sys.executable, str(TRAIN), "--config", str(bad)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "config error: unknown key 'optim.lrr' (did you mean 'lr'?)" in result.stderr


def test_fp16_on_cpu_is_refused_at_start_up():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: fp16 with GradScaler is allowed")
    result = subprocess.run(
        [sys.executable, str(TRAIN), "--set", "precision.mode=fp16"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "precision.mode=fp16 uses torch.amp.GradScaler and needs CUDA" in result.stderr


@pytest.mark.slow
def test_every_rank_reports_a_bad_config_and_nothing_hangs(tmp_path):
    """Each rank refuses the config on its own, before any collective, so none waits for another. Under
    torchrun the first rank to exit makes the agent stop the others, so which ranks get to print there is a
    race: each rank is therefore also run alone, as torchrun would start it."""
    bad = write(tmp_path, "ddp:\n  comm_hook: int8\n")
    refusal = "config error: ddp.comm_hook: 'int8' is not one of"
    result = torchrun(TRAIN, "--config", str(bad), timeout=90)
    assert result.returncode != 0
    assert refusal in result.stderr
    for rank in (0, 1):
        as_started = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        # No MASTER_ADDR/PORT: a rank that tried to join the group would fail on that, not on the config.
        alone = subprocess.run(
            [sys.executable, str(TRAIN), "--config", str(bad)],
            capture_output=True,
            text=True,
            env={**env(), **as_started},
            timeout=90,
            check=False,
        )
        assert alone.returncode == 2 and f"[rank {rank}] {refusal}" in alone.stderr, alone.stderr[-2000:]
