"""Debian 13: CUDA runtime and NCCL pinned and held on every node, the driver only where a GPU is, and the
consistency check, also through its training-image hook."""

import re
import subprocess

import pytest
from apt_state import apt_would_change, candidate, held_packages, installed_version
from gpu_checks import NODES, inventory_var, node, run_check

testinfra_hosts = NODES
DRIVER = inventory_var("gpu_stack_driver_version")
CUDA = inventory_var("gpu_stack_cuda_version")
NCCL = inventory_var("gpu_stack_nccl_version")
LIBRARIES = {"libcudart12": CUDA, "libnccl2": NCCL}
GPU_NODE = "gpu-d13-node0"


@pytest.mark.parametrize("package", LIBRARIES)
def test_libraries_at_their_exact_version_on_every_node(host, package):
    assert installed_version(host, package) == LIBRARIES[package]


@pytest.mark.parametrize("package", LIBRARIES)
def test_libraries_pinned_and_held(host, package):
    assert package in held_packages(host)
    assert candidate(host, package) == LIBRARIES[package]
    policy = host.check_output(f"apt-cache policy {package}")
    assert re.search(rf"\*\*\* {re.escape(LIBRARIES[package])} 1001", policy), policy
    assert package not in apt_would_change(host, "upgrade")
    assert package not in apt_would_change(host, f"install {package}")


def test_driver_only_where_a_gpu_is(host):
    # node0's PCI bus has an NVIDIA 3D controller; node1's only an NVIDIA HDMI audio function.
    if host.check_output("hostname") == GPU_NODE:
        assert installed_version(host, "libcuda1") == DRIVER
        assert installed_version(host, "nvidia-smi") == DRIVER
        assert {"libcuda1", "nvidia-smi"} <= held_packages(host)
    else:
        assert installed_version(host, "libcuda1") == ""
        assert installed_version(host, "nvidia-smi") == ""
        assert not (host.file("/etc/apt/preferences.d/gpu-stack-driver.pref").exists)


def test_distribution_sources_file_untouched(host):
    shipped = subprocess.run(
        ["docker", "run", "--rm", "ddp-testhost:debian13", "cat", "/etc/apt/sources.list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert host.file("/etc/apt/sources.list").content_string == shipped
    # NCCL comes from the contrib component the role added in its own file.
    assert "trixie/contrib" in host.check_output("apt-cache policy libnccl2")


def test_consistency_check_passes_comparing_the_driver_on_gpu_nodes_only():
    result = run_check()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "agree on gpu-d13-node0, gpu-d13-node1" in output
    # node1 has no GPU: its driver columns read "-", its libraries are compared.
    assert re.search(rf"gpu-d13-node1\s+-\s+-\s+-\s+{re.escape(CUDA)}\s+{re.escape(NCCL)}", output), output[-3000:]
    assert re.search(rf"gpu-d13-node0\s+{re.escape(DRIVER)}\s", output), output[-3000:]


def test_consistency_check_asks_torch_in_the_image_once_per_image_id_and_names_the_odd_node():
    image = inventory_var("gpu_test_image")
    first = run_check("-e", f"gpu_stack_check_image={image}")
    output = first.stdout + first.stderr
    assert first.returncode != 0, output[-3000:]
    assert "gpu-d13-node1: image NCCL is 2.20.5, reference 2.21.5" in output, output[-3000:]
    assert "gpu-d13-node0: image" not in output

    # node1 gets an image whose torch agrees (another id); node0's answer would now differ, under the same id.
    node("gpu-d13-node1").run_expect([0], "echo sha256:1 > /etc/gpu-test-image-id")
    node("gpu-d13-node1").run_expect([0], "echo 2.4.1+cu124 12.4 2.21.5 > /etc/gpu-test-torch-answer")
    node("gpu-d13-node0").run_expect([0], "echo 2.4.1+cu124 12.4 2.19.3 > /etc/gpu-test-torch-answer")
    second = run_check("-e", f"gpu_stack_check_image={image}")
    output = second.stdout + second.stderr
    # node0's answer came from its cache, node1's from its new image: they agree.
    assert second.returncode == 0, output[-3000:]
    runs = {name: node(name).file("/var/log/gpu-test-docker-runs").content_string.count("run") for name in NODES}
    assert runs == {"gpu-d13-node0": 1, "gpu-d13-node1": 2}
