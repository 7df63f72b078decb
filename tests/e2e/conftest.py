"""The lab for the e2e tests: up once per session, down at the end (also when a test fails).
DDP_E2E_KEEP_LAB=1 leaves it running afterwards, and a lab left running that way is reused."""

import os
import subprocess
from dataclasses import dataclass

import pytest
from lab import (
    INVENTORY,
    JOB,
    LAB_SH,
    NODES,
    RESTART_AFTER_STEP,
    SERVER,
    STEPS,
    BackgroundTraining,
    Training,
    job_runs,
    lab,
    newest_step,
    on,
    site,
    wait_for_step,
)

KEEP = os.environ.get("DDP_E2E_KEEP_LAB") == "1"


def lab_answers() -> bool:
    return INVENTORY.exists() and all(on(node, "true", timeout=30).returncode == 0 for node in NODES)


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
    restart: subprocess.CompletedProcess[str]
    step_at_restart: int


@pytest.fixture(scope="session")
def training(site_runs):
    first, _ = site_runs
    assert first.rc == 0, f"site.yml failed, nothing to train on:\n{first.output[-3000:]}"
    earlier_runs = job_runs(JOB)
    run = BackgroundTraining("RESUME=never", f"EXTRA_VARS=train_steps={STEPS}")
    # Past the step-10 checkpoint (the lab saves every 10 steps), well before the end.
    this_run = wait_for_step(JOB, RESTART_AFTER_STEP, 900, earlier_runs, run)
    step_at_restart = newest_step(JOB, this_run)
    restart = on(SERVER, "systemctl restart nfs-server && systemctl is-active nfs-server")
    return FaultedTraining(run.wait(timeout=1200), restart, step_at_restart)
