"""Adding a node keeps the cluster key the first nodes already had; a joining node's earlier key is kept as a backup."""

import os

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = AnsibleRunner(INVENTORY).get_hosts("cluster")
SSH_DIR = "/home/ddp/.ssh"
CLUSTER_KEY = f"{SSH_DIR}/ddp_cluster_ed25519"


def test_key_is_the_one_made_before_the_third_node_joined(host):
    first = AnsibleRunner(INVENTORY).get_hosts("initial_nodes")[0]
    first_node = testinfra.get_host(f"ansible://{first}?ansible_inventory={INVENTORY}")
    before = first_node.file("/root/initial-cluster-key.fpr").content_string.strip()
    now = host.check_output(f"ssh-keygen -lf {CLUSTER_KEY}.pub").split()[1]
    assert before, "prepare did not record the key"
    assert now == before


def test_replaced_key_kept_as_backup(host):
    stale = host.file("/root/user-before/stale_cluster_ed25519")
    if not stale.exists:
        pytest.skip("prepare left no earlier cluster key on this node")
    assert host.file(CLUSTER_KEY).sha256sum != stale.sha256sum
    # copy's backup: <file>.<pid>.<time>~ beside it, same owner and mode.
    backups = host.check_output(f"find {SSH_DIR} -name 'ddp_cluster_ed25519.[0-9]*~'").split()
    assert [host.file(path).sha256sum for path in backups] == [stale.sha256sum]
    assert (host.file(backups[0]).user, host.file(backups[0]).mode) == ("ddp", 0o600)
