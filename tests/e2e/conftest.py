"""The lab for the e2e tests: up once per session, down at the end (also when a test fails).
DDP_E2E_KEEP_LAB=1 leaves it running afterwards, and a lab left running that way is reused."""

import os
from dataclasses import dataclass
from typing import Any

import pytest
from lab import (
    INVENTORY,
    LAB_SH,
    NODES,
    PORTS,
    STEPS,
    Training,
    arm_nfs_restart,
    lab,
    nfs_restart_outcome,
    on,
    site,
    train,
)

KEEP = os.environ.get("DDP_E2E_KEEP_LAB") == "1"


def lab_answers() -> bool:
    return PORTS.is_dir() and all(on(node, "true", timeout=30).returncode == 0 for node in NODES)


@pytest.fixture(scope="session")
def lab_up():
    reused = KEEP and lab_answers()
    if not reused:
        started = lab("up")
        assert started.rc == 0, f"{LAB_SH} up failed:\n{started.output[-3000:]}"
    yield INVENTORY
    if not KEEP:
        lab("down")


@pytest.fixture(scope="session")
def site_runs(lab_up):
    """site.yml twice against the lab: the converge and the rerun that must change nothing."""
    first = site()
    second = site() if first.rc == 0 else None
    return first, second


@dataclass
class FaultedTraining:
    """One `make train` across both VMs during which the NFS server was restarted."""

    training: Training
    # What tests/e2e/nfs_restart_watch.py recorded on the server.
    restart: dict[str, Any]


@pytest.fixture(scope="session")
def training(site_runs):
    first, _ = site_runs
    assert first.rc == 0, f"site.yml failed, nothing to train on:\n{first.output[-3000:]}"
    arm_nfs_restart()
    run = train("RESUME=never", f"EXTRA_VARS=train_steps={STEPS}")
    return FaultedTraining(run, nfs_restart_outcome())
