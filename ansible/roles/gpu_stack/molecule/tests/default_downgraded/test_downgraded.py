"""After the version was set back to the older one: both nodes moved down, pinned and held there."""

import pytest
from apt_state import apt_would_change, candidate, held_packages, installed_version
from gpu_checks import NODES, inventory_var, run_check

testinfra_hosts = NODES
OLDER = inventory_var("gpu_test_driver_older")
DRIVER = ["libcuda1", "nvidia-smi", "libnvidia-ml1"]


@pytest.mark.parametrize("package", DRIVER)
def test_every_node_moved_down_to_the_older_version(host, package):
    assert installed_version(host, package) == OLDER


def test_older_version_stays_against_apt(host):
    assert set(DRIVER) <= held_packages(host)
    assert candidate(host, "libcuda1") == OLDER
    assert not set(apt_would_change(host, "upgrade")) & set(DRIVER)
    assert not set(apt_would_change(host, "install " + " ".join(DRIVER))) & set(DRIVER)


def test_consistency_check_passes():
    result = run_check()
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "agree on gpu-d12-node0, gpu-d12-node1" in result.stdout
