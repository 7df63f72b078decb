"""Fixtures shared by the unit tests (helpers that are plain functions live in the _*.py modules beside this)."""

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from _playbooks import PlaybookRun, run_playbook


@pytest.fixture
def playbook(tmp_path: Path) -> Callable[..., PlaybookRun]:
    """run_playbook with a fresh private directory under the test's tmp_path for every call."""
    numbers = itertools.count()

    def run(playbook: Path | str, inventory: Path, *options: str) -> PlaybookRun:
        return run_playbook(playbook, inventory, *options, private_dir=tmp_path / f"runner-{next(numbers)}")

    return run
