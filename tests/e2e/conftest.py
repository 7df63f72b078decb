"""The lab for the e2e tests: up once per session, down at the end (also when a test fails).
DDP_E2E_KEEP_LAB=1 leaves it running afterwards, and a lab left running that way is reused."""

import os

import pytest
from lab import INVENTORY, LAB_SH, NODES, lab, on, site, train

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


@pytest.fixture(scope="session")
def first_training(site_runs):
    first, _ = site_runs
    assert first.rc == 0, f"site.yml failed, nothing to train on:\n{first.output[-3000:]}"
    return train("RESUME=never")
