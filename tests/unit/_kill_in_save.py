"""torchrun entry point for the fault test: train.py, except that rank 0 is SIGKILLed halfway through writing the
checkpoint of step KILL_AT_STEP (env DDP_TEST_KILL_AT_STEP): a real kill, with a partial file on disk."""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "train"))

import checkpoint

import train

KILL_AT_STEP = int(os.environ["DDP_TEST_KILL_AT_STEP"])
original_save = checkpoint.atomic_save


def save_then_die_midway(state, path):
    if state["step"] != KILL_AT_STEP:
        return original_save(state, path)
    written = 0
    original_write = checkpoint._HashingWriter.write

    def write(self, data):
        nonlocal written
        written += original_write(self, data)
        if written > 4096:  # some bytes are in the temp file, the rest never will be
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return len(data)

    checkpoint._HashingWriter.write = write
    return original_save(state, path)


checkpoint.atomic_save = save_then_die_midway
sys.exit(train.main())
