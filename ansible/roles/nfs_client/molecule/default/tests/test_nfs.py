"""The client mounts the server's export over real kernel NFSv4.2; data flows both ways; root is squashed;
the roles refuse a dead server and an export open to everyone before changing anything."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
RUNNER = AnsibleRunner(INVENTORY)
SERVER_NAME = RUNNER.get_hosts("nfs_server")[0]
CLIENT_NAME = RUNNER.get_hosts("nfs_clients")[0]
SERVER_ADDRESS = "10.213.50.10"
SHARED = "/data"
USER = "ddp"
NOBODY = "65534:65534"
testinfra_hosts = [CLIENT_NAME]


def ansible_playbook() -> str:
    """The ansible-playbook beside this Python (the venv), else the one on PATH."""
    found = shutil.which(
        "ansible-playbook", path=os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"]))
    )
    assert found, "ansible-playbook not found"
    return found


def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


@pytest.fixture(scope="module")
def server():
    return node(SERVER_NAME)


@pytest.fixture
def name():
    return f"t-{uuid.uuid4().hex[:12]}"


def as_user(host, command):
    return host.check_output(f"runuser -u {USER} -- sh -c {command!r}")


def test_shared_dir_is_a_hard_nfs42_mount_of_the_server(host):
    fstype, source = host.check_output(f"findmnt -no FSTYPE,SOURCE {SHARED}").split()
    options = host.check_output(f"findmnt -no OPTIONS {SHARED}").split(",")
    assert fstype == "nfs4"
    assert source == f"{SERVER_ADDRESS}:{SHARED}"
    assert "hard" in options
    assert "vers=4.2" in options
    assert "nconnect=4" in options


def test_boot_mount_waits_for_the_network(host):
    unit = host.check_output(f"systemd-escape --path --suffix=mount {SHARED}")
    after = host.check_output(f"systemctl show -p After --value {unit}").split()
    assert "network-online.target" in after


def test_file_written_on_client_is_read_on_server(host, server, name):
    as_user(host, f"echo {name} > {SHARED}/{name}")
    try:
        assert server.file(f"{SHARED}/{name}").content_string.strip() == name
        assert server.file(f"{SHARED}/{name}").user == USER
    finally:
        server.run(f"rm -f {SHARED}/{name}")


def test_file_written_on_server_is_read_on_client(host, server, name):
    as_user(server, f"echo {name} > {SHARED}/{name}")
    try:
        assert as_user(host, f"cat {SHARED}/{name}").strip() == name
    finally:
        server.run(f"rm -f {SHARED}/{name}")


def test_root_on_the_client_is_squashed(host, server, name):
    # Refused in the user's own directory; where anyone may write, the file belongs to nobody on the server.
    refused = host.run(f"touch {SHARED}/{name}")
    assert refused.rc != 0
    assert "Permission denied" in refused.stderr
    open_dir = f"{SHARED}/{name}.d"
    as_user(server, f"mkdir -m 1777 {open_dir}")
    try:
        host.check_output(f"touch {open_dir}/by-root")
        assert server.check_output(f"stat -c %u:%g {open_dir}/by-root") == NOBODY
    finally:
        server.run(f"rm -rf {open_dir}")


def run_storage_playbook(limit, *extra_vars):
    """ansible-playbook storage.yml against one VM with overrides, as an operator would run it."""
    playbook = Path(os.environ["DDP_REPO_ROOT"]) / "ansible/playbooks/storage.yml"
    command = [
        ansible_playbook(),
        "-i",
        str(Path(INVENTORY).parent),
        str(playbook),
        "--limit",
        limit,
    ]
    for extra in extra_vars:
        command += ["-e", extra]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)
    # Ansible prints the play to stdout and the failure to stderr; the tests read both as one.
    return result.returncode, " ".join((result.stdout + result.stderr).split())


def test_client_refuses_a_server_that_does_not_answer_before_any_change(host):
    fstab_before = host.file("/etc/fstab").content_string
    dead = "10.213.50.99"  # on the VMs' private network, where nothing holds it
    rc, output = run_storage_playbook(CLIENT_NAME, f"nfs_client_server={dead}", "nfs_client_server_timeout=3")
    assert rc != 0
    assert f"NFS server {dead} does not answer on TCP port 2049 from {CLIENT_NAME}" in output
    assert "changed=0" in output
    assert host.file("/etc/fstab").content_string == fstab_before
    assert host.check_output(f"findmnt -no SOURCE {SHARED}") == f"{SERVER_ADDRESS}:{SHARED}"


def test_server_refuses_an_export_to_everyone_before_any_change(server):
    exports_before = server.file("/etc/exports.d/ddp.exports").content_string
    rc, output = run_storage_playbook(SERVER_NAME, '{"cluster_cidrs": ["*"]}')
    assert rc != 0
    assert "must be limited to the cluster CIDRs, never `*`" in output
    assert "changed=0" in output
    assert server.file("/etc/exports.d/ddp.exports").content_string == exports_before
    assert "10.213.50.0/24(" in server.check_output("exportfs -s")
