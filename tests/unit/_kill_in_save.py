"""torchrun entry point for the fault tests: train.py, except that rank 0 is SIGKILLed halfway through writing the
checkpoint of step KILL_AT_STEP (env DDP_TEST_KILL_AT_STEP): a real kill, with a partial file on disk.

With DDP_TEST_KILL_AFTER_STEP too, the write, once part-way, holds until the training thread has logged that step:
the kill then lands while a background save (checkpoint.async) is in flight and training has gone on."""

import os
import signal
import sys
import threading
from pathlib import Path

from ddp_train import checkpoint, metrics
from ddp_train import main as train

KILL_AT_STEP = int(os.environ["DDP_TEST_KILL_AT_STEP"])
AFTER_STEP = int(os.environ.get("DDP_TEST_KILL_AFTER_STEP", "0"))
original_save = checkpoint.atomic_save
original_step = metrics.MetricsLog.step
trained_on = threading.Event()


def step_and_tell(self: metrics.MetricsLog, record: dict) -> None:
    original_step(self, record)
    if record["step"] >= AFTER_STEP:
        trained_on.set()


def save_then_die_midway(state: dict, path: Path) -> str:
    if state["step"] != KILL_AT_STEP:
        return original_save(state, path)
    written = 0
    original_write = checkpoint._HashingWriter.write

    def write(self: checkpoint._HashingWriter, data: bytes) -> int:
        nonlocal written
        written += original_write(self, data)
        if written > 4096:  # some bytes are in the temp file, the rest never will be
            self.file.flush()
            if AFTER_STEP and not trained_on.wait(60):
                print(f"_kill_in_save: step {AFTER_STEP} never came while the write was held", file=sys.stderr)
            os.kill(os.getpid(), signal.SIGKILL)
        return len(data)

    checkpoint._HashingWriter.write = write
    return original_save(state, path)


checkpoint.atomic_save = save_then_die_midway
metrics.MetricsLog.step = step_and_tell
sys.exit(train.main())
