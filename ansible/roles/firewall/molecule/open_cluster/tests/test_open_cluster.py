"""Without default drop, cluster_wide: the cluster reaches everything, others all but the cluster's ports."""

from fwprobe import address, listening, node, reachable_from, reachable_from_controller

PROTECTED, CLUSTER_PEER = "fw-d13-node0", "fw-d13-node1"
SSH, RPCBIND, NFS, RENDEZVOUS, OTHER, HIGH = 22, 111, 2049, 29500, 8080, 40000
CLUSTER_PORTS = (RPCBIND, NFS, RENDEZVOUS)


def test_cluster_reaches_every_port():
    ports = (*CLUSTER_PORTS, OTHER, HIGH)
    with listening(PROTECTED, ports):
        assert reachable_from(CLUSTER_PEER, address(PROTECTED), ports) == dict.fromkeys(ports, True)


def test_controller_reaches_ssh_and_other_ports_but_not_the_cluster_ports():
    ports = (SSH, *CLUSTER_PORTS, OTHER)
    with listening(PROTECTED, (*CLUSTER_PORTS, OTHER)):
        assert reachable_from_controller(address(PROTECTED), ports) == {p: p not in CLUSTER_PORTS for p in ports}


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
