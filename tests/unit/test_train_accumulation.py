"""Gradient accumulation with model.no_sync() makes the same update as one large batch (loop.train_step)."""

import _train_helpers
import pytest
import torch
import torch.distributed as dist
from ddp_train.components import build_optimizer, build_scaler, build_scheduler, wrap_ddp
from ddp_train.config import load_config
from ddp_train.data import DataInfo
from ddp_train.loop import Trainer, train_step
from ddp_train.metrics import MetricsLog
from ddp_train.models import build_model


@pytest.fixture
def gloo_group():
    with _train_helpers.gloo_group_of_one() as info:
        yield info


class Batches:
    """Stands in for data.BatchStream."""

    def __init__(self, batches):
        self.batches, self.epoch = list(batches), 0

    def next(self):
        return self.batches.pop(0)


def one_step(info, tmp_path, accum, batches, extra=()):
    cfg = load_config(
        None,
        [
            "data.dataset=synthetic",
            "model.norm=group",  # BatchNorm statistics would differ between micro-batches and one batch
            "model.width=8",
            f"data.batch_size={32 // accum}",
            f"run.grad_accum_steps={accum}",
            "optim.momentum=0.9",
            "optim.weight_decay=0.01",
            *extra,
        ],
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, DataInfo("image", channels=3, num_classes=10))
    ddp, comm = wrap_ddp(model, cfg, info)
    optimizer = build_optimizer(ddp, cfg.optim, cfg.optim.lr)
    t = Trainer(
        cfg,
        info,
        model=ddp,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.optim, 10),
        scaler=build_scaler(cfg.precision, info.device),
        stream=Batches(batches),
        eval_loader=None,
        log=MetricsLog(tmp_path, False, False, print),
        comm=comm,
        ckpt_dir=None,
        target_step=1,
    )
    totals = train_step(t)
    return [p.detach().clone() for p in model.parameters()], totals


@pytest.mark.parametrize("extra", [(), ("ddp.comm_hook=none", "metrics.measure_comm=false"), ("optim.grad_clip=0.5",)])
def test_four_micro_batches_equal_one_batch_of_four_times_the_size(gloo_group, tmp_path, extra):
    torch.manual_seed(1)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    big, big_totals = one_step(gloo_group, tmp_path, 1, [(x, y)], extra)
    micro = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    small, small_totals = one_step(gloo_group, tmp_path, 4, micro, extra)
    for a, b in zip(big, small, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # loss is the mean of the micro-batch means; predictions counted once each
    torch.testing.assert_close(big_totals[0], small_totals[0] / 4, atol=1e-5, rtol=1e-5)
    assert big_totals[2].item() == small_totals[2].item() == 32


def test_no_sync_really_skips_the_allreduce(gloo_group, tmp_path):
    torch.manual_seed(1)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    calls = []
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        one_step(gloo_group, tmp_path, 4, [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)])
    finally:
        dist.all_reduce = original
    # On gloo the gradients go through the timing comm hook (dist.all_reduce): one bucket, once per optimizer
    # step rather than once per micro-batch; then the loop's metrics reduction (3 numbers).
    n_params = sum(
        p.numel()
        for p in build_model(
            load_config(None, ["model.width=8"]).model, DataInfo("image", channels=3, num_classes=10)
        ).parameters()
    )
    assert calls == [n_params, 3]
