"""After the version was changed to the newer one for every node: node0 moved up, both held, the check passes."""

import pytest
from apt_state import apt_would_change, held_packages, installed_version
from gpu_checks import NODES, inventory_var, run_check

testinfra_hosts = NODES
NEWER = inventory_var("gpu_test_driver_newer")
DRIVER = ["libcuda1", "nvidia-smi", "libnvidia-ml1"]


@pytest.mark.parametrize("package", DRIVER)
def test_every_node_runs_the_newer_version(host, package):
    assert installed_version(host, package) == NEWER


def test_driver_packages_are_held_again(host):
    assert set(DRIVER) <= held_packages(host)
    assert not set(apt_would_change(host, "upgrade")) & set(DRIVER)


def test_consistency_check_passes():
    result = run_check()
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "agree on gpu-d12-node0, gpu-d12-node1" in result.stdout
