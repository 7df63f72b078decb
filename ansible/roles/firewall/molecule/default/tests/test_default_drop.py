"""Default drop on node0, seen from its peer node1 and from the controller, with real connections."""

import subprocess

import pytest
from fwprobe import (
    LAST_GOOD,
    RULES_FILE,
    TABLE,
    address,
    assert_unit_stopped,
    decisions,
    listening,
    node,
    probe,
    reachable_from,
    reachable_from_controller,
    table_listing,
    wait_booted,
)
from testhosts import container

PROTECTED, PEER, OUTSIDER = "fw-d12-node0", "fw-d12-node1", "fw-d12-out"
RENDEZVOUS, NFS, SSH = 29500, 2049, 22
IN_RANGE, ABOVE_RANGE, OTHER = 50500, 52500, 8080
RANGE_EDGES = (50000, 51999)
ALLOWED = (SSH, RENDEZVOUS, IN_RANGE, NFS)
NOT_ALLOWED = (OTHER, ABOVE_RANGE)
LISTENERS = (RENDEZVOUS, IN_RANGE, NFS, OTHER, ABOVE_RANGE, *RANGE_EDGES)
# Every port the role opens to the cluster on node0 (NFSv4 only: TCP alone).
CLUSTER_PORTS = [f"tcp/{p}" for p in (*ALLOWED, *RANGE_EDGES)]
# The inventory says scheduler: slurm, so firewall_cluster_services holds Slurm's ports: slurmctld, slurmd and
# the edges of srun's range; just outside that range stays closed.
SLURM_OPEN = (6817, 6818, 61000, 61499)
SLURM_CLOSED = (60999, 61500)
SLURM_PORTS = [f"tcp/{p}" for p in (*SLURM_OPEN, *SLURM_CLOSED)]


@pytest.fixture(scope="module")
def protected():
    with listening(PROTECTED, LISTENERS):
        yield address(PROTECTED)


def test_peer_reaches_the_cluster_ports(protected):
    assert probe(PEER, protected, dict.fromkeys(CLUSTER_PORTS, True)) == dict.fromkeys(CLUSTER_PORTS, True)


def test_outsider_reaches_no_port(protected):
    # In neither cluster_cidrs nor admin_cidrs. Ping (ICMP is accepted) shows it is on the network.
    node(OUTSIDER).run_expect([0], f"ping -c 1 -W 3 {protected}")
    expected = dict.fromkeys([*CLUSTER_PORTS, f"tcp/{OTHER}"], False)
    assert probe(OUTSIDER, protected, expected) == expected


def test_cluster_services_are_open_to_the_cluster_only():
    with listening(PROTECTED, (*SLURM_OPEN, *SLURM_CLOSED)):
        target = address(PROTECTED)
        from_peer = {f"tcp/{p}": p in SLURM_OPEN for p in (*SLURM_OPEN, *SLURM_CLOSED)}
        assert probe(PEER, target, from_peer) == from_peer
        closed = dict.fromkeys(SLURM_PORTS, False)
        assert probe(OUTSIDER, target, closed) == closed
        assert reachable_from_controller(target, SLURM_OPEN) == dict.fromkeys(SLURM_OPEN, False)
    # The same for an IPv6 source, member or not; each service's rules carry its name.
    sources = (address(PEER), "fd00:db8:d12::7", "2001:db8::7")
    open_ports = [f"tcp/{p}" for p in SLURM_OPEN]
    assert decisions(PROTECTED, open_ports, sources) == dict.fromkeys(open_ports, ("accept", "accept", "drop"))
    listing = table_listing(PROTECTED)
    assert all(f'comment "{name}"' in listing for name in ("slurmctld", "slurmd", "srun"))


def test_ipv6_rules_decide_as_the_ipv4_ones():
    # The real traffic above is IPv4; the table must treat an IPv6 source (cluster_cidrs holds
    # fd00:db8:d12::/64) as it treats IPv4: cluster member in, anyone else out, on every cluster port.
    sources = (address(PEER), address(OUTSIDER), "fd00:db8:d12::7", "2001:db8::7")
    assert decisions(PROTECTED, CLUSTER_PORTS, sources) == dict.fromkeys(
        CLUSTER_PORTS, ("accept", "drop", "accept", "drop")
    )


def test_peer_cannot_reach_any_other_port(protected):
    # The listeners answer on loopback (the fixture checked), so only the firewall can stop these.
    assert reachable_from(PEER, protected, NOT_ALLOWED) == dict.fromkeys(NOT_ALLOWED, False)


def test_controller_outside_the_cluster_gets_ssh_only(protected):
    # The controller is in admin_cidrs but not in cluster_cidrs.
    ports = (SSH, RENDEZVOUS, IN_RANGE, NFS, OTHER)
    assert reachable_from_controller(protected, ports) == {p: p == SSH for p in ports}


def test_nfs_is_open_on_the_nfs_server_only():
    with listening(PEER, (NFS, RENDEZVOUS)):
        assert reachable_from(PROTECTED, address(PEER), (NFS, RENDEZVOUS)) == {NFS: False, RENDEZVOUS: True}


@pytest.mark.parametrize("name", [PROTECTED, PEER])
def test_kernel_hands_out_data_ports_from_the_open_range(name):
    # NCCL and gloo bind to port 0; whatever the kernel picks must be inside the opened range.
    picked = node(name).check_output(
        "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"
    )
    assert 50000 <= int(picked) <= 51999
    assert node(name).file("/etc/sysctl.d/60-ddp-firewall.conf").contains("^net.ipv4.ip_local_port_range")


@pytest.mark.parametrize("name", [PROTECTED, PEER])
def test_rules_of_others_survive_converge_and_rerun(name):
    assert 'comment "rule of someone else"' in node(name).check_output("nft list table ip other")
    # Docker's own rules for the container's DNS (iptables-nft), there from the start.
    assert "DOCKER_OUTPUT" in node(name).check_output("nft list table ip nat")


def test_unit_reloads_the_table_after_it_is_lost(protected):
    host = node(PROTECTED)
    assert host.service("ddp-firewall").is_enabled
    host.run_expect([0], f"nft delete table {TABLE}")
    assert reachable_from(PEER, protected, (OTHER,)) == {OTHER: True}
    host.run_expect([0], "systemctl restart ddp-firewall")
    assert reachable_from(PEER, protected, (RENDEZVOUS, OTHER)) == {RENDEZVOUS: True, OTHER: False}
    assert 'comment "rule of someone else"' in host.check_output("nft list table ip other")


def test_rollback_unit_restores_the_last_confirmed_ruleset(protected):
    # What the rollback timer runs when the controller does not confirm: here after a ruleset that shuts
    # out the peer has been loaded behind the role's back.
    host = node(PROTECTED)
    confirmed = table_listing(PROTECTED)
    host.run_expect([0], f"sed -i 's/{RENDEZVOUS}/{RENDEZVOUS + 1}/g' {RULES_FILE}")
    host.run_expect([0], "systemctl reload ddp-firewall")
    assert reachable_from(PEER, protected, (RENDEZVOUS,)) == {RENDEZVOUS: False}
    host.run_expect([0], "systemctl start ddp-firewall-rollback.service")
    assert reachable_from(PEER, protected, (RENDEZVOUS,)) == {RENDEZVOUS: True}
    assert table_listing(PROTECTED) == confirmed
    assert host.file(RULES_FILE).content_string == host.file(LAST_GOOD).content_string


def test_rollback_timer_is_disarmed_after_a_confirmed_run():
    assert_unit_stopped(PROTECTED, "ddp-firewall-rollback.timer")


def test_rules_come_back_after_a_reboot():
    # Restarting the container gives it a fresh network namespace with an empty ruleset, as a reboot does.
    node(PROTECTED).run_expect([0], "nft list table ip other")
    subprocess.run(["docker", "restart", container(PROTECTED)], check=True, capture_output=True)
    wait_booted(PROTECTED)
    assert node(PROTECTED).run("nft list table ip other").rc != 0, "the restart did not empty the ruleset"
    with listening(PROTECTED, (RENDEZVOUS, OTHER)):
        assert reachable_from(PEER, address(PROTECTED), (RENDEZVOUS, OTHER)) == {RENDEZVOUS: True, OTHER: False}
