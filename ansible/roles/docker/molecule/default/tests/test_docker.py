"""The engine runs with the daemon.json the role wrote: checked through the daemon and a container it runs."""

import json
import os

import pytest
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = AnsibleRunner(INVENTORY).get_hosts("cluster")

CLUSTER_USER = "ddp"
# The scenario's settings (molecule.yml); node1 also moves the data root and adds a log option.
SHM_KIB = 256 * 1024
DATA_ROOT = {"dkr-d12-node0": "/var/lib/docker", "dkr-d13-node1": "/srv/docker"}
LOG_OPTS = {
    "dkr-d12-node0": {"max-size": "10m", "max-file": "2"},
    "dkr-d13-node1": {"max-size": "10m", "max-file": "2", "labels": "ddp.role"},
}
PROBE = "ddp-probe:local"
# train_runtime per node (molecule.yml): the cluster user may use the engine only where the cluster trains in it.
RUNTIME = {"dkr-d12-node0": "docker", "dkr-d13-node1": "host"}


@pytest.fixture(scope="module")
def info(host):
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


@pytest.fixture(scope="module")
def probe_image(host):
    # No registry is reachable: the image is the host's own df and true with the C library they need.
    files = "bin/df bin/true lib64/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/libc.so.6"
    host.check_output(f"tar -C / -chf - {files} | docker import - {PROBE}")
    yield PROBE
    host.run(f"docker image rm {PROBE}")


def test_engine_enabled_and_running(host):
    service = host.service("docker")
    assert service.is_enabled
    assert service.is_running


def test_daemon_runs_with_configured_settings(host, info):
    name = host.check_output("hostname")
    assert info["LoggingDriver"] == "json-file"
    assert info["LiveRestoreEnabled"] is True
    assert info["DockerRootDir"] == DATA_ROOT[name]
    # The data root is on a real filesystem (the anonymous volume), so the engine picks overlay2.
    assert info["Driver"] == "overlay2"
    # No NVIDIA GPU on this machine: the default runtime stays runc.
    assert info["DefaultRuntime"] == "runc"


def test_container_gets_configured_log_rotation(host, probe_image):
    name = host.check_output("hostname")
    cid = host.check_output(f"docker create {probe_image} /bin/true")
    try:
        inspect = host.check_output(f"docker inspect --format '{{{{json .HostConfig.LogConfig}}}}' {cid}")
        log_config = json.loads(inspect)
    finally:
        host.run(f"docker rm {cid}")
    assert log_config == {"Type": "json-file", "Config": LOG_OPTS[name]}


def test_container_gets_configured_shm_size(host, probe_image):
    # No bridge: engine 26 (Debian 13) sets IPv6 sysctls for bridged containers, and /proc/sys is read-only
    # inside a test host. Training uses the host network anyway.
    out = host.check_output(f"docker run --rm --network none {probe_image} /bin/df -k /dev/shm")
    size_kib = int(out.splitlines()[-1].split()[1])
    assert size_kib == SHM_KIB


def test_cluster_user_runs_containers_only_where_the_cluster_trains_in_them(host, probe_image):
    result = host.run(f"runuser -u {CLUSTER_USER} -- docker run --rm --network host {probe_image} /bin/true")
    if RUNTIME[host.check_output("hostname")] == "docker":
        assert result.rc == 0, result.stderr
    else:
        # The docker group is root on the node: a cluster on the host runtime never grants it.
        assert result.rc != 0 and "permission denied" in result.stderr, (result.rc, result.stderr)
        assert "docker" not in host.user(CLUSTER_USER).groups
