"""The production source against a stand-in of NVIDIA's repository: key checked and trusted through Signed-By
only, every component pinned to its older version above the newer candidate, held, and a wrong key refused."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from apt_state import apt_would_change, candidate, held_packages, installed_version
from gpu_checks import INVENTORY, NODES, REPO, available_versions, inventory_var, run_check

testinfra_hosts = NODES
VERSIONS = inventory_var("gpu_test_repo_versions")
PINNED = {"libcuda1": "driver", "nvidia-smi": "driver", "cuda-cudart-12-4": "cuda", "libnccl2": "nccl"}
SOURCE = "/etc/apt/sources.list.d/gpu-stack-nvidia.sources"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.asc"


@pytest.mark.parametrize("package", PINNED)
def test_each_component_at_its_pinned_older_version(host, package):
    older, newer = VERSIONS[PINNED[package]]
    assert newer in available_versions(host, package)
    assert installed_version(host, package) == older
    assert candidate(host, package) == older
    assert package in held_packages(host)


def test_apt_keeps_every_component(host):
    assert not set(apt_would_change(host, "upgrade")) & set(PINNED)
    assert not set(apt_would_change(host, "install " + " ".join(PINNED))) & set(PINNED)


def test_repository_trusted_through_its_own_keyring_only(host):
    source = host.file(SOURCE).content_string
    assert re.search(r"^URIs: file:///srv/nvidia-standin/debian12/x86_64/$", source, re.M), source
    assert f"Signed-By: {KEYRING}" in source
    # The key is not in apt's global trust: only this source accepts it.
    assert not host.file("/etc/apt/trusted.gpg").exists
    assert host.run("ls /etc/apt/trusted.gpg.d/ | grep -i cuda").rc != 0
    fingerprints = host.check_output(f"gpg --show-keys --with-colons {KEYRING} | awk -F: '$1==\"fpr\"{{print $10}}'")
    # prepare wrote the stand-in key's fingerprint where the scenario's inventory reads it.
    standin = (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "standin.fpr").read_text().strip()
    assert fingerprints.split() == [standin]


def test_a_key_with_another_fingerprint_is_refused():
    wrong = "EB693B3035CD5710E231E123A4B469963BF863CC"  # NVIDIA's real key: not what signs the stand-in
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(Path(INVENTORY).parent),
            str(REPO / "ansible/playbooks/gpu.yml"),
            "-e",
            f"gpu_stack_nvidia_repo_key_fingerprint={wrong}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert f"not gpu_stack_nvidia_repo_key_fingerprint={wrong}" in re.sub(r"\s+", " ", output), output[-3000:]
    assert "Pin the packages" not in output


def test_consistency_check_passes():
    result = run_check()
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
