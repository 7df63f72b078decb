"""Adding a node keeps the cluster key the first nodes already had."""

import os

import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = AnsibleRunner(INVENTORY).get_hosts("cluster")


def test_key_is_the_one_made_before_the_third_node_joined(host):
    first = AnsibleRunner(INVENTORY).get_hosts("initial_nodes")[0]
    first_node = testinfra.get_host(f"ansible://{first}?ansible_inventory={INVENTORY}")
    before = first_node.file("/root/initial-cluster-key.fpr").content_string.strip()
    now = host.check_output("ssh-keygen -lf ~ddp/.ssh/id_ed25519.pub").split()[1]
    assert before, "prepare did not record the key"
    assert now == before
