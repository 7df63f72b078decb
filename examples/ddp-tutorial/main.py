"""A tutorial-style DDP script, as users bring them: positional arguments, a sibling module, and a
`snapshot.pt` in the working directory that a restart resumes from.

    torchrun --nproc-per-node=2 main.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N]
    make train PROGRAM=examples/ddp-tutorial/main.py ARGS='20 5 --batch_size 32'
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from model import RegressionTask
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = Path("snapshot.pt")  # relative: the job's work directory, shared by every node


def train(total_epochs: int, save_every: int, batch_size: int) -> None:
    rank = dist.get_rank()
    task = RegressionTask()
    model = DistributedDataParallel(task.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first_epoch = 0
    if SNAPSHOT.exists():
        snapshot = torch.load(SNAPSHOT, weights_only=True)
        model.module.load_state_dict(snapshot["model"])
        first_epoch = snapshot["epochs_run"]
        print(f"[rank {rank}] Resuming training from snapshot at epoch {first_epoch}", flush=True)
    sampler = DistributedSampler(task.dataset)
    loader = DataLoader(task.dataset, batch_size=batch_size, sampler=sampler)
    for epoch in range(first_epoch, total_epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
            if (epoch + 1) % save_every == 0 or epoch + 1 == total_epochs:
                # Written aside and renamed, so that a crash mid-save leaves the previous snapshot whole.
                partial = SNAPSHOT.with_suffix(".pt.tmp")
                torch.save({"model": model.module.state_dict(), "epochs_run": epoch + 1}, partial)
                partial.replace(SNAPSHOT)
                print(f"epoch {epoch}: snapshot saved to {SNAPSHOT.resolve()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="tutorial-style DDP job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        train(args.total_epochs, args.save_every, args.batch_size)
    finally:
        # DDP holds the process group through reference cycles: free them while the interpreter is whole, or gloo's
        # threads can abort the process at exit after a good run (pytorch/pytorch#190489, #179291).
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter finalization for what is left of gloo to abort in
