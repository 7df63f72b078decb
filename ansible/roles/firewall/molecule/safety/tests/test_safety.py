"""A bad change does no harm: refused before anything changes, or rolled back by the node itself."""

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from fwprobe import (
    address,
    assert_unit_stopped,
    node,
    node_state,
    reachable_from_controller,
    recap_changed,
    run_playbook,
)
from testhosts import NETWORK_PREFIX

NODE = "fw-d12-safe0"
SSH = 22


@pytest.fixture(scope="module")
def over_ssh(tmp_path_factory):
    """An inventory that reaches the node over real SSH from the controller, through the firewall, with the
    node's host key pinned (read over docker exec, a trusted path) and a key made for this test."""
    work = tmp_path_factory.mktemp("ssh")
    key = work / "id_ed25519"
    host = node(NODE)
    ip = address(NODE)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public_key = key.with_suffix(".pub").read_text().strip()
    host.run_expect([0], f"install -d -m 0700 /root/.ssh && echo '{public_key}' >> /root/.ssh/authorized_keys")
    host_key = " ".join(host.file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[:2])
    (work / "known_hosts").write_text(f"{ip} {host_key}\n")
    inventory = work / "ssh.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    {NODE}:\n      ansible_connection: ssh\n      ansible_host: {ip}\n"
        f"      ansible_user: root\n      ansible_ssh_private_key_file: {key}\n"
        f"      ansible_ssh_common_args: -o UserKnownHostsFile={work / 'known_hosts'}\n"
    )
    return inventory


def test_refused_when_the_controller_is_not_in_admin_cidrs(over_ssh):
    before = node_state(NODE)
    result = run_playbook({"admin_cidrs": ["192.0.2.0/24"]}, extra_inventory=over_ssh)
    assert result.returncode != 0
    controller = f"{NETWORK_PREFIX}.1"  # the run network's gateway
    assert f"refusing to change {NODE}: the controller connects from '{controller}'" in " ".join(result.stdout.split())
    assert recap_changed(result) == [0]
    assert node_state(NODE) == before


def test_ruleset_that_shuts_the_controller_out_is_rolled_back(over_ssh):
    # The firewall would move SSH to 2222 while sshd stays on 22: valid for nft, fatal for the controller.
    before = node_state(NODE)
    result = run_playbook(
        {"firewall_ssh_port": 2222, "firewall_confirm_timeout_s": 5, "firewall_rollback_after_s": 12},
        extra_inventory=over_ssh,
    )
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    # Over SSH the controller check ran and let the controller's real address (in admin_cidrs) through.
    assert re.search(rf"Refuse a ruleset that would shut the controller out\] \**\s*ok: \[{NODE}\]", out)
    assert f"rolled back on {NODE}: 'Connect afresh through the new rules' failed" in out
    assert node_state(NODE) == before
    assert reachable_from_controller(address(NODE), (SSH,)) == {SSH: True}
    assert_unit_stopped(NODE, "ddp-firewall-rollback.timer")


def test_ruleset_rejected_by_nft_changes_nothing():
    before = node_state(NODE)
    result = run_playbook({"firewall_extra_input_rules": ["tcp dport 9 frobnicate"]})
    assert result.returncode != 0
    assert "nft -c rejected the generated ruleset" in " ".join(result.stdout.split())
    assert node_state(NODE) == before


BAD_INPUTS = {
    # The messages of the shared validators (ansible/plugins/filter/ddp_validators.py), naming variable and host.
    "port above 65535": ({"rendezvous_port": 70000}, f"firewall_rendezvous_port=70000 on {NODE}: not a port"),
    "port not a number": ({"firewall_nfs_port": "nfs"}, "firewall_nfs_port"),
    "range upside down": (
        {"firewall_data_port_range_start": 52000},
        f"firewall_data_port_range_start=52000 on {NODE} is above firewall_data_port_range_end=51999",
    ),
    "rendezvous port in the range": (
        {"rendezvous_port": 50001},
        f"firewall_rendezvous_port=50001 on {NODE} is also inside firewall_data_port_range_start-end (50000-51999)",
    ),
    "malformed CIDR": (
        {"admin_cidrs": [f"{NETWORK_PREFIX}.1/33"]},
        f"firewall_admin_cidrs entry {NETWORK_PREFIX}.1/33 on {NODE}: not an IP network",
    ),
    "host bits set": ({"cluster_cidrs": ["10.0.0.1/24"]}, "has host bits set"),
    "bad mode": ({"firewall_data_ports_mode": "everything"}, "firewall_data_ports_mode must be one of"),
    "default drop without admins": ({"admin_cidrs": []}, "firewall_admin_cidrs is empty"),
}


@pytest.fixture(scope="module")
def bad_input_runs():
    before = node_state(NODE)
    with ThreadPoolExecutor(len(BAD_INPUTS)) as pool:
        runs = dict(zip(BAD_INPUTS, pool.map(lambda case: run_playbook(case[0]), BAD_INPUTS.values()), strict=True))
    return before, runs


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_refused_before_any_change(bad_input_runs, case):
    before, runs = bad_input_runs
    result, expected = runs[case], BAD_INPUTS[case][1]
    assert result.returncode != 0
    assert expected in " ".join(result.stdout.split()), result.stdout[-2000:]
    assert recap_changed(result) == [0]
    assert node_state(NODE) == before
