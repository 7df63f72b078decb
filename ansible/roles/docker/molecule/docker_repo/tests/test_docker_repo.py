"""The production source against a stand-in of Docker's repository: docker-ce and docker-ce-cli pinned to the older
version though a newer one is offered, and held; the source trusted through its Signed-By key only; the engine
from the package running with the role's daemon.json; the pin moved up by the stage playbook and back."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from apt_state import apt_would_change, candidate, held_packages, installed_version
from testinfra.utils.ansible_runner import AnsibleRunner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
ROOT = Path(os.environ["DDP_REPO_ROOT"])
testinfra_hosts = AnsibleRunner(INVENTORY).get_hosts("cluster")

# molecule.yml: the stand-in's [pinned, newer] versions, as Docker numbers its Debian 12 packages.
PINNED, NEWER = AnsibleRunner(INVENTORY).get_variables(testinfra_hosts[0])["docker_test_versions"]
DEB_VERSION = "5:{}-1~debian.12~bookworm"
HELD = ["docker-ce", "docker-ce-cli"]
URL = "http://127.0.0.1:8765/linux/debian"
REPO_DIR = "/srv/docker-standin/linux/debian"
SOURCE = "/etc/apt/sources.list.d/docker.sources"
KEYRING = "/etc/apt/keyrings/docker.asc"
# apt-get update of the docker source alone (the other sources' lists stay as they are), failing on what apt
# otherwise only warns about: a source whose signature fails keeps its previous, verified lists.
UPDATE_DOCKER_SOURCE = (
    f"apt-get update --error-on=any -o Dir::Etc::SourceList={SOURCE} -o Dir::Etc::SourceParts=/nonexistent"
    " -o APT::Get::List-Cleanup=0"
)
PROBE = "ddp-probe:local"


def fingerprints(host, key_file: str) -> list[str]:
    out = host.check_output(f"gpg --show-keys --with-colons {key_file}")
    return [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]


def run_stage(**extravars) -> subprocess.CompletedProcess[str]:
    """The container stage playbook against the scenario's host, as an operator runs it."""
    command = ["ansible-playbook", "-i", str(Path(INVENTORY).parent), str(ROOT / "ansible/playbooks/container.yml")]
    command += ["-e", json.dumps(extravars)]
    env = os.environ | {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=600)


def recap_changed(result: subprocess.CompletedProcess[str]) -> list[int]:
    """The changed= counts of the play recap, one per host."""
    return [
        int(field.split("=")[1])
        for line in result.stdout.splitlines()
        if " : ok=" in line
        for field in line.split()
        if field.startswith("changed=")
    ]


def assert_engine_runs_the_installed_binary(host) -> None:
    """The engine is up and runs the dockerd now on disk: after a package change, not the replaced file."""
    assert host.service("docker").is_running
    exe = host.check_output("readlink /proc/$(systemctl show -p MainPID --value docker)/exe")
    assert exe == "/usr/sbin/dockerd", exe


def assert_pinned_and_held(host, version: str) -> None:
    for package in HELD:
        assert installed_version(host, package) == DEB_VERSION.format(version), package
    assert set(HELD) <= held_packages(host)
    selections = host.check_output("dpkg --get-selections " + " ".join(HELD)).split()
    assert selections == [HELD[0], "hold", HELD[1], "hold"], selections


@pytest.fixture(scope="module")
def probe_image(host):
    # No registry is reachable: the image is the host's own df and true with the C library they need.
    files = "bin/df bin/true lib64/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/libc.so.6"
    host.check_output(f"tar -C / -chf - {files} | docker import - {PROBE}")
    yield PROBE
    host.run(f"docker image rm {PROBE}")


@pytest.mark.parametrize("package", HELD)
def test_pinned_older_version_installed_and_held_though_newer_offered(host, package):
    assert DEB_VERSION.format(NEWER) in host.check_output(f"apt-cache madison {package}")
    # Nothing but the hold keeps the package down: apt's candidate is the newer version.
    assert candidate(host, package) == DEB_VERSION.format(NEWER)
    assert_pinned_and_held(host, PINNED)


def test_apt_upgrades_leave_the_held_engine(host):
    for args in ("upgrade", "dist-upgrade"):
        assert not set(apt_would_change(host, args)) & set(HELD), args
    # The rest of Docker's set is installed from the stand-in, unpinned.
    for package in ("containerd.io", "docker-buildx-plugin"):
        assert installed_version(host, package) == candidate(host, package) != ""


def test_source_is_deb822_with_signed_by_the_served_key(host):
    source = host.file(SOURCE).content_string
    assert re.search(rf"^URIs: {re.escape(URL)}$", source, re.M), source
    assert re.search(r"^Suites: bookworm$", source, re.M), source
    assert re.search(r"^Components: stable$", source, re.M), source
    assert re.search(r"^Architectures: amd64$", source, re.M), source
    assert re.search(rf"^Signed-By: {KEYRING}$", source, re.M), source
    # The keyring is the key the repository serves, which is the key that signs it.
    fetch = f"import urllib.request; print(urllib.request.urlopen('{URL}/gpg').read().decode(), end='')"
    assert host.file(KEYRING).content_string.strip() == host.check_output(f'python3 -c "{fetch}"').strip()
    standin = fingerprints(host, f"{REPO_DIR}/gpg")
    assert fingerprints(host, KEYRING) == standin and len(standin) == 1
    # apt's global trust does not hold it: only the docker source accepts it.
    assert not host.file("/etc/apt/trusted.gpg").exists
    for key_file in host.file("/etc/apt/trusted.gpg.d").listdir():
        assert standin[0] not in fingerprints(host, f"/etc/apt/trusted.gpg.d/{key_file}"), key_file


def test_repository_resigned_by_another_key_is_refused(host):
    inrelease = f"{REPO_DIR}/dists/bookworm/InRelease"
    host.check_output(f"cp -p {inrelease} {inrelease}.orig")
    try:
        other = host.check_output(
            "export GNUPGHOME=$(mktemp -d)"
            " && gpg --batch --passphrase '' --quick-gen-key 'another key' ed25519 sign never 2>/dev/null"
            f" && gpg --batch --yes --clearsign --output {inrelease} {REPO_DIR}/dists/bookworm/Release"
            " && gpg --with-colons --list-keys | awk -F: '$1==\"fpr\"{print $10; exit}'"
            " && gpgconf --kill gpg-agent && rm -rf $GNUPGHOME"
        )
        refused = host.run(UPDATE_DOCKER_SOURCE)
    finally:
        host.check_output(f"mv {inrelease}.orig {inrelease}")
    output = refused.stdout + refused.stderr
    assert refused.rc != 0, output
    # apt checked the signature against the keyring and did not know the signer.
    assert f"GPG error: {URL} bookworm InRelease" in output, output
    assert f"NO_PUBKEY {other[-16:]}" in output, output
    # The control: signed by the served key again, the source updates.
    restored = host.run(UPDATE_DOCKER_SOURCE)
    assert restored.rc == 0 and "NO_PUBKEY" not in restored.stdout + restored.stderr, restored.stdout + restored.stderr


def test_engine_from_the_package_runs_with_the_role_settings(host, probe_image):
    assert host.service("docker").is_enabled
    # The running daemon is the docker-ce package's, and so is the client.
    assert_engine_runs_the_installed_binary(host)
    assert host.check_output("dpkg -S /usr/sbin/dockerd").startswith("docker-ce: ")
    assert host.check_output("dpkg -S /usr/bin/docker").startswith("docker-ce-cli: ")
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert info["LoggingDriver"] == "json-file"
    assert info["LiveRestoreEnabled"] is True
    assert info["Driver"] == "overlay2"
    cid = host.check_output(f"docker create {probe_image} /bin/true")
    try:
        inspect = host.check_output(f"docker inspect --format '{{{{json .HostConfig.LogConfig}}}}' {cid}")
    finally:
        host.run(f"docker rm {cid}")
    assert json.loads(inspect) == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}}
    # containerd.io's containerd and runc (Debian's) run a container.
    run = host.run(f"docker run --rm --network none {probe_image} /bin/true")
    assert run.rc == 0, run.stderr


def test_moving_docker_version_moves_the_held_packages(host):
    try:
        moved = run_stage(docker_version=NEWER)
        assert moved.returncode == 0, moved.stdout[-3000:] + moved.stderr[-3000:]
        assert_pinned_and_held(host, NEWER)
        # The package change restarted the engine (docker-ce's postinst), as no daemon.json change did.
        assert_engine_runs_the_installed_binary(host)
        again = run_stage(docker_version=NEWER)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert recap_changed(again) == [0], again.stdout[-3000:]
    finally:
        # Back to the scenario's pin, which also moves the held packages down.
        back = run_stage()
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert_pinned_and_held(host, PINNED)
    assert_engine_runs_the_installed_binary(host)
