"""Every cluster node reaches every other one over real sshd, as the cluster user, with pinned host keys."""

import os

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
NODES = AnsibleRunner(INVENTORY).get_hosts("cluster")
CLUSTER_USER = "ddp"
testinfra_hosts = NODES


def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def cluster_address(name):
    return node(name).interface.default().addresses[0]


def ssh_as_cluster_user(host, target, *options):
    opts = " ".join(("-o BatchMode=yes", "-o StrictHostKeyChecking=yes", *options))
    return host.run(f"runuser -u {CLUSTER_USER} -- ssh {opts} {target} hostname")


@pytest.mark.parametrize("peer", NODES)
def test_reaches_peer_by_inventory_name_and_cluster_address(host, peer):
    me = host.check_output("hostname")
    if peer == me:
        pytest.skip("a node does not need to reach itself")
    for target in (peer, cluster_address(peer)):
        result = ssh_as_cluster_user(host, target)
        assert result.rc == 0, f"{me} -> {target}: {result.stderr}"
        assert result.stdout.strip() == peer


def test_cluster_key_refused_from_outside_the_cluster_cidr(host):
    # Loopback is outside the cluster CIDR, so from="..." must reject the key; the host key itself is
    # pinned (HostKeyAlias), so a failure here can only be the authorization.
    me = host.check_output("hostname")
    result = ssh_as_cluster_user(host, "127.0.0.1", f"-o HostKeyAlias={me}")
    assert result.rc != 0
    assert "Permission denied" in result.stderr


def test_one_cluster_key_everywhere(host):
    fingerprints = {node(name).check_output(f"ssh-keygen -lf ~{CLUSTER_USER}/.ssh/id_ed25519.pub") for name in NODES}
    assert len(fingerprints) == 1, fingerprints


def test_private_key_readable_by_its_owner_only(host):
    key = host.file(f"/home/{CLUSTER_USER}/.ssh/id_ed25519")
    assert key.user == CLUSTER_USER
    assert key.mode == 0o600
