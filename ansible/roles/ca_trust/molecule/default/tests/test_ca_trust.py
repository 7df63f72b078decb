"""The system trust store of ca-node0 after the role: TLS to a server signed by an installed CA verifies, TLS to
one signed by an unknown CA does not, and the role removed only its own dropped file."""

import os

import pytest
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = AnsibleRunner(INVENTORY).get_hosts("ca-node0")
TRUST_DIR = "/usr/local/share/ca-certificates"
# Python's default context reads the system bundle (as pip, requests and Ansible's get_url do).
FETCH = "python3 -c \"import urllib.request; print(urllib.request.urlopen('https://ca-node1:{}/').read().decode())\""


def test_server_signed_by_an_installed_ca_verifies(host):
    assert host.check_output(FETCH.format(8443)) == "ok"


def test_server_signed_by_an_unknown_ca_is_refused(host):
    refused = host.run(FETCH.format(8444))
    assert refused.rc != 0
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr


@pytest.mark.parametrize("name", ["ddp-test-ca.crt", "ddp-second-ca.crt"])
def test_each_listed_certificate_is_installed(host, name):
    installed = host.file(f"{TRUST_DIR}/{name}")
    assert installed.is_file and installed.mode == 0o644 and installed.user == "root"


def test_a_ca_dropped_from_the_list_is_no_longer_trusted_and_another_tools_ca_still_is(host):
    """Prepare trusted both (update-ca-certificates) before the role ran; only the role's own file goes."""
    assert not host.file(f"{TRUST_DIR}/ddp-dropped.crt").exists
    assert host.file(f"{TRUST_DIR}/someone-else.crt").exists
    dropped = host.run(FETCH.format(8445))
    assert dropped.rc != 0 and "CERTIFICATE_VERIFY_FAILED" in dropped.stderr, dropped.stdout + dropped.stderr
    assert host.check_output(FETCH.format(8446)) == "ok"
