"""Every cluster node reaches every other one over real sshd, as the cluster user, with pinned host keys, using a
cluster key of its own beside the user's own keys, authorized_keys lines and ssh settings (made in prepare)."""

import os

import pytest
import testinfra
from testhosts import NETWORK_PREFIX
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
NODES = AnsibleRunner(INVENTORY).get_hosts("cluster")
CLUSTER_USER = "ddp"
CLUSTER_CIDRS = f"{NETWORK_PREFIX}.0/24"  # cluster_cidrs in molecule/base.yml
SSH_DIR = f"/home/{CLUSTER_USER}/.ssh"
CLUSTER_KEY = f"{SSH_DIR}/ddp_cluster_ed25519"
BEFORE = "/root/user-before"  # what prepare gave the user, as it was
testinfra_hosts = NODES


def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def cluster_address(name):
    return node(name).interface.default().addresses[0]


def as_cluster_user(host, command):
    return host.run(f"runuser -u {CLUSTER_USER} -- timeout 60 {command}")


def ssh_as_cluster_user(host, target, *options):
    opts = " ".join(("-o BatchMode=yes", "-o StrictHostKeyChecking=yes", *options))
    return as_cluster_user(host, f"ssh {opts} {target} hostname")


def peers_of(host):
    me = host.check_output("hostname")
    return [name for name in NODES if name != me]


def public_key(host, path):
    """'type base64' of a public key file (comment dropped)."""
    return " ".join(host.file(path).content_string.split()[:2])


def cluster_lines(host):
    lines = host.file(f"{SSH_DIR}/authorized_keys").content_string.splitlines()
    return [line for line in lines if line.split()[-1:] == ["ddp-cluster"]]


def effective_ssh_config(host, target):
    """ssh -G: the settings ssh would use for target, as {keyword: [values]}, without connecting."""
    settings = {}
    for line in as_cluster_user(host, f"ssh -G {target}").stdout.splitlines():
        keyword, _, value = line.partition(" ")
        settings.setdefault(keyword, []).append(value)
    return settings


@pytest.mark.parametrize("peer", NODES)
def test_reaches_peer_by_inventory_name_and_cluster_address(host, peer):
    me = host.check_output("hostname")
    if peer == me:
        pytest.skip("a node does not need to reach itself")
    for target in (peer, cluster_address(peer)):
        result = ssh_as_cluster_user(host, target)
        assert result.rc == 0, f"{me} -> {target}: {result.stderr}"
        assert result.stdout.strip() == peer


def test_plain_ssh_to_a_peer_needs_no_arguments(host):
    # No -i and no options: only the role's ~/.ssh/config block can make ssh offer the cluster key (the
    # personal id_ed25519 that ssh offers by itself is authorized nowhere).
    for peer in peers_of(host):
        result = as_cluster_user(host, f"ssh {peer} true")
        assert result.rc == 0, f"ssh {peer} true: {result.stderr}"


def test_cluster_key_refused_from_outside_the_cluster_cidr(host):
    # Loopback is outside the cluster CIDR, so from="..." must reject the key; the host key itself is
    # pinned (HostKeyAlias), so a failure here can only be the authorization. 127.0.0.1 is no member name,
    # so the key is named here: the client config would not offer it.
    me = host.check_output("hostname")
    result = ssh_as_cluster_user(
        host, "127.0.0.1", f"-o HostKeyAlias={me}", f"-i {CLUSTER_KEY}", "-o IdentitiesOnly=yes"
    )
    assert result.rc != 0
    assert "Permission denied" in result.stderr


def test_cluster_key_line_is_restricted_and_from_the_cluster_cidr_only(host):
    lines = cluster_lines(host)
    assert len(lines) == 1, lines
    options, key = lines[0].split(" ", 1)
    assert options.split(",") == ["restrict", f'from="{CLUSTER_CIDRS}"']
    assert key.rsplit(" ", 1)[0] == public_key(host, f"{CLUSTER_KEY}.pub")


def test_cluster_key_gets_no_terminal_and_no_forwarding(host):
    # restrict, seen from the client: a forced pty is refused, and so is a tunnel through the peer.
    peer = peers_of(host)[0]
    pty = as_cluster_user(host, f"ssh -o BatchMode=yes -tt {peer} true")
    assert "PTY allocation request failed" in pty.stderr, pty.stderr
    tunnel = as_cluster_user(host, f"ssh -o BatchMode=yes -W 127.0.0.1:22 {peer} </dev/null")
    assert tunnel.rc != 0
    assert "administratively prohibited" in tunnel.stderr, tunnel.stderr


def test_users_own_authorized_key_kept_and_earlier_cluster_key_removed(host):
    keys = host.file(f"{SSH_DIR}/authorized_keys").content_string
    laptop = host.file(f"{BEFORE}/laptop_ed25519.pub").content_string.strip()
    earlier_cluster_key = public_key(host, f"{BEFORE}/old_cluster_ed25519.pub")
    assert laptop in keys.splitlines()
    assert earlier_cluster_key not in keys


def test_personal_key_untouched(host):
    for suffix in ("", ".pub"):
        key, before = host.file(f"{SSH_DIR}/id_ed25519{suffix}"), host.file(f"{BEFORE}/id_ed25519{suffix}")
        assert key.sha256sum == before.sha256sum
        assert (key.user, key.mode) == (CLUSTER_USER, before.mode)
    assert public_key(host, f"{SSH_DIR}/id_ed25519.pub") != public_key(host, f"{CLUSTER_KEY}.pub")


def test_cluster_key_offered_to_members_only_and_alone(host):
    for target in (*NODES, *(cluster_address(name) for name in NODES)):
        settings = effective_ssh_config(host, target)
        assert settings["identityfile"][0] == CLUSTER_KEY, (target, settings["identityfile"])
        assert settings["identitiesonly"] == ["yes"], target
    outsider = effective_ssh_config(host, "git.example.org")
    assert CLUSTER_KEY not in outsider["identityfile"]
    assert outsider["identitiesonly"] == ["no"]


def test_users_own_ssh_settings_kept(host):
    config = host.file(f"{SSH_DIR}/config").content_string
    own = host.file(f"{BEFORE}/config").content_string
    outside_the_block = config.split("# END ddp cluster members (ssh_mesh)\n", 1)[1]
    assert outside_the_block == own
    # Still in force: the user's top-level line for every host, members too; their Host block for its host.
    for target in (NODES[0], "git.example.org"):
        assert effective_ssh_config(host, target)["serveraliveinterval"] == ["42"], target
    assert effective_ssh_config(host, "git.example.org")["user"] == ["alice"]


def test_one_cluster_key_everywhere(host):
    fingerprints = {node(name).check_output(f"ssh-keygen -lf {CLUSTER_KEY}.pub") for name in NODES}
    assert len(fingerprints) == 1, fingerprints


def test_private_key_readable_by_its_owner_only(host):
    key = host.file(CLUSTER_KEY)
    assert key.user == CLUSTER_USER
    assert key.mode == 0o600


def test_known_hosts_pins_each_member_once_by_name_and_address_and_keeps_the_admins_own(host):
    lines = host.file("/etc/ssh/ssh_known_hosts").content_string.splitlines()
    assert lines[0].startswith("gateway.example.org ssh-ed25519 "), lines
    for name in NODES:
        pins = [line for line in lines if line.split(" ", 1)[0] == f"{name},{cluster_address(name)}"]
        assert [pin.split(" ", 1)[1] for pin in pins] == [public_key(node(name), "/etc/ssh/ssh_host_ed25519_key.pub")]
