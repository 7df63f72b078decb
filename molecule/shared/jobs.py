"""Small test jobs shared by the unit tier (inventory/local) and the container tier, and what the adversarial job
(adversary/attack.py) must come to in both."""

import hashlib
from pathlib import Path

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


def tree_hashes(directory: Path) -> dict[str, str]:
    """Each regular file under directory by relative path: its SHA-256 (to show a run's artifacts unchanged)."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def assert_reached_nothing(attempts: dict) -> None:
    """One rank's report of adversary/attack.py: nothing of root's or another account's was reached."""
    assert attempts["read_secret"].startswith("refused"), attempts
    assert [runner for runner, end in attempts["runners"].items() if "(uid 0)" in runner and end == "done"] == []
    assert attempts["signalled_others"] == [], attempts
    assert attempts["links"]["work/leak (symlink)"] == "done", attempts  # so the collection met it
