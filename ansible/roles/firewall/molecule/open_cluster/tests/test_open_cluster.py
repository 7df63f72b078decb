"""Without default drop, cluster_wide: the cluster reaches everything, others all but the cluster's ports."""

import pytest
from fwprobe import (
    address,
    assert_unit_stopped,
    decisions,
    listening,
    node,
    probe,
    reachable_from,
    reachable_from_controller,
)

PROTECTED, CLUSTER_PEER, OUTSIDER = "fw-d13-node0", "fw-d13-node1", "fw-d13-out"
SSH, RPCBIND, NFS, RENDEZVOUS, OTHER, HIGH = 22, 111, 2049, 29500, 8080, 40000
CLUSTER_PORTS = (RPCBIND, NFS, RENDEZVOUS)
# The NFSv3 helpers (tcp and udp), and the kernel's ephemeral range (32768-60999, checked below) where NCCL,
# gloo and the per-rank stores listen in cluster_wide mode: its edges and a port inside.
NFS_V3, DATA = (32765, 32767, 32768), (32768, HIGH, 60999)
TCP_PORTS = sorted({RPCBIND, NFS, RENDEZVOUS, *NFS_V3, *DATA})
UDP_PORTS = (RPCBIND, NFS, *NFS_V3)
# Every port node0 (the NFS server) keeps for the cluster; OTHER stands for the rest of the node.
CLUSTER = [f"tcp/{SSH}"] + [f"tcp/{p}" for p in TCP_PORTS] + [f"udp/{p}" for p in UDP_PORTS]
REST = [f"tcp/{OTHER}", f"udp/{OTHER}"]


@pytest.fixture(scope="module")
def protected():
    with listening(PROTECTED, (*TCP_PORTS, OTHER), (*UDP_PORTS, OTHER)):
        yield address(PROTECTED)


def test_cluster_reaches_every_port(protected):
    expected = dict.fromkeys(CLUSTER + REST, True)
    assert probe(CLUSTER_PEER, protected, expected) == expected


def test_outsider_reaches_every_port_but_the_cluster_ports(protected):
    # In neither cluster_cidrs nor admin_cidrs; the open rest shows it is on the network.
    expected = dict.fromkeys(CLUSTER, False) | dict.fromkeys(REST, True)
    assert probe(OUTSIDER, protected, expected) == expected


def test_ipv6_rules_decide_as_the_ipv4_ones():
    # The real traffic above is IPv4; the table must treat an IPv6 source (cluster_cidrs holds
    # fd00:db8:d13::/64) as it treats IPv4: cluster member in, anyone else out, on every cluster port.
    sources = (address(CLUSTER_PEER), address(OUTSIDER), "fd00:db8:d13::7", "2001:db8::7")
    assert decisions(PROTECTED, CLUSTER + REST, sources) == dict.fromkeys(
        CLUSTER, ("accept", "drop", "accept", "drop")
    ) | dict.fromkeys(REST, ("accept",) * 4)


def test_controller_reaches_ssh_and_other_ports_but_not_the_cluster_ports(protected):
    ports = (SSH, *CLUSTER_PORTS, HIGH, OTHER)
    closed = (*CLUSTER_PORTS, HIGH)
    assert reachable_from_controller(protected, ports) == {p: p not in closed for p in ports}


def test_node_outside_the_cluster_cidr_is_kept_off_the_rendezvous_port():
    # node0 is in the inventory's cluster group but not in cluster_cidrs: the CIDR decides, not the group.
    with listening(CLUSTER_PEER, (RENDEZVOUS, OTHER)):
        assert reachable_from(PROTECTED, address(CLUSTER_PEER), (RENDEZVOUS, OTHER)) == {RENDEZVOUS: False, OTHER: True}


def test_port_range_is_left_to_the_kernel():
    host = node(PROTECTED)
    assert not host.file("/etc/sysctl.d/60-ddp-firewall.conf").exists
    assert host.file("/proc/sys/net/ipv4/ip_local_port_range").content_string.split() == ["32768", "60999"]


def test_loaded_at_boot():
    assert node(PROTECTED).service("ddp-firewall").is_enabled
    assert "policy accept" in node(PROTECTED).check_output("nft list chain inet ddp_cluster input")


def test_rollback_timer_is_disarmed_after_a_confirmed_run():
    assert_unit_stopped(PROTECTED, "ddp-firewall-rollback.timer")
