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
