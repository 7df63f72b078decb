"""The step this rank has reached, for the node runner's hang check (DDP_PROGRESS_DIR, set by the launch).

A rank writes the number of the step whose forward pass it has finished, just before the backward pass that
synchronises it with its peers: a rank stuck before that point (a stalled loader, a wedged kernel) is then a
step behind the ranks that wait for it in the collective, and its node is the one named."""

from __future__ import annotations

import os
from pathlib import Path


class Progress:
    def __init__(self, directory: str | None, rank: int) -> None:
        self.path = Path(directory) / f"rank-{rank}" if directory else None

    @classmethod
    def from_env(cls, rank: int) -> Progress:
        return cls(os.environ.get("DDP_PROGRESS_DIR"), rank)

    def reached(self, step: int) -> None:
        if self.path is None:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(f"{step}\n")
        partial.replace(self.path)  # the runner never reads half a number
