"""components.ddp_in_effect: what summary.json reports is read back from DDP, not copied from the config."""

import pytest
from _train_helpers import gloo_group_of_one
from ddp_train.components import build_optimizer, build_scaler, ddp_in_effect, wrap_ddp
from ddp_train.config import load_config
from ddp_train.data import DataInfo
from ddp_train.models import build_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, imported by ZeRO


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["ddp.comm_hook=none", "metrics.measure_comm=false"], {"comm_hook": None, "comm_hook_timed": False}),
        (["ddp.comm_hook=fp16"], {"comm_hook": "fp16_compress_hook", "comm_hook_timed": True}),
        (
            ["ddp.comm_hook=powersgd", "ddp.powersgd_rank=2", "optim.zero=true", "ddp.bucket_cap_mb=0.5"],
            {"comm_hook": "powerSGD_hook", "powersgd_rank": 2, "zero": True, "bucket_cap_mb": 0.5},
        ),
        (["ddp.static_graph=true", "model.activation_checkpointing=true"], {"static_graph": True}),
    ],
)
def test_ddp_in_effect_reads_the_hook_and_options_back(sets, expected):
    cfg = load_config(None, ["model.width=4", *sets])
    with gloo_group_of_one() as info:
        ddp, _ = wrap_ddp(build_model(cfg.model, DataInfo("image", channels=1, num_classes=10)), cfg, info)
        effect = ddp_in_effect(ddp, build_optimizer(ddp, cfg.optim, 0.1), build_scaler(cfg.precision, info.device))
    assert effect | expected == effect, effect
    assert effect["activation_checkpointing"] is cfg.model.activation_checkpointing
