"""Small test jobs shared by the unit tier (inventory/local) and the container tier."""

# Rank 0 saves a checkpoint and dies with the exit code given as its argument; the next attempt finds the
# checkpoint and finishes (train_retries).
FLAKY = """import os, pathlib, sys
checkpoint = pathlib.Path(os.environ["DDP_CHECKPOINT_DIR"]) / "ckpt-000005.pt"
if os.environ["RANK"] == "0":
    if checkpoint.exists():
        print(f"resumed from {checkpoint.name}")
    else:
        checkpoint.write_text("step 5")
        print("failing after step 5")
        sys.exit(int(sys.argv[1]))
"""

# Every rank steps through all-reduces, reporting each step it reaches (DDP_PROGRESS_DIR, as train/ does); at
# step 3 the last rank stops before reporting it, as a wedged rank would, and the others wait for it in the
# collective for ever: train_hang_after_s must end the run and name the last rank's node.
HANG = """import os, pathlib, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, last = dist.get_rank(), dist.get_world_size() - 1
progress = pathlib.Path(os.environ["DDP_PROGRESS_DIR"]) / f"rank-{rank}"
for step in range(1, 1000):
    if step == 3 and rank == last:
        print("rank", rank, "wedged before step 3", flush=True)
        time.sleep(3600)
    progress.write_text(f"{step}\\n")
    dist.all_reduce(torch.ones(1))
    time.sleep(0.2)
"""
