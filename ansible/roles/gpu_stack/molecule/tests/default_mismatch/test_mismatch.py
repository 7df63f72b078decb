"""After converge: each node pinned and held at its own inventory version, and the check names the odd node."""

import pytest
from apt_state import apt_would_change, candidate, held_packages, installed_version
from gpu_checks import NODES, available_versions, inventory_var, run_check

testinfra_hosts = NODES
OLDER = inventory_var("gpu_test_driver_older")
NEWER = inventory_var("gpu_test_driver_newer")
EXPECTED = {"gpu-d12-node0": OLDER, "gpu-d12-node1": NEWER}
DRIVER = ["libcuda1", "nvidia-smi", "libnvidia-ml1"]


@pytest.mark.parametrize("package", DRIVER)
def test_each_node_runs_its_inventory_version(host, package):
    me = host.check_output("hostname")
    assert installed_version(host, package) == EXPECTED[me]


def test_driver_packages_are_held(host):
    assert set(DRIVER) <= held_packages(host)


def test_older_version_is_pinned_above_the_newer_candidate(host):
    if host.check_output("hostname") != "gpu-d12-node0":
        pytest.skip("node0 holds the older version")
    assert NEWER in available_versions(host, "libcuda1"), "the scenario needs a newer version to resist"
    assert candidate(host, "libcuda1") == OLDER


def test_apt_upgrade_and_install_leave_the_driver_alone(host):
    assert not set(apt_would_change(host, "upgrade")) & set(DRIVER)
    assert not set(apt_would_change(host, "install " + " ".join(DRIVER))) & set(DRIVER)


def test_hold_alone_keeps_the_driver_when_pins_are_ignored(host):
    # Without the preferences files apt's candidate is a newer version (bookworm's, or bookworm-security's);
    # the hold must still win.
    if host.check_output("hostname") != "gpu-d12-node0":
        pytest.skip("node0 holds the older version")
    no_pins = "-o Dir::Etc::PreferencesParts=/nonexistent -o Dir::Etc::Preferences=/nonexistent"
    assert candidate(host, "libcuda1", no_pins) != OLDER
    assert not set(apt_would_change(host, f"{no_pins} upgrade")) & set(DRIVER)


def test_consistency_check_fails_naming_the_odd_node():
    result = run_check()
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"gpu-d12-node1: driver (dpkg) is {NEWER}, reference {OLDER}" in output, output[-3000:]
    assert "gpu-d12-node0: driver" not in output
    # The table shows both nodes with their versions.
    assert OLDER in output
    assert f"{NEWER} *" in output
