"""The NFS roles' input checks (tasks/validate.yml) accept the cluster's settings and refuse exports open to
everyone, malformed CIDRs and options, members outside the cluster CIDRs, and bad mount settings. They run on
the controller only: the checks are asserts, so no module touches this machine."""

import json
from pathlib import Path

import pytest
import yaml
from _playbooks import LOCAL_HOST, run_playbook, write_inventory

CASE_TASKS = """
- name: Try one case
  block:
    # Every case file sets every checked variable, so no case inherits another's settings.
    - name: Load the case's settings
      ansible.builtin.include_vars:
        file: "{{ case_dir }}/{{ case }}.yml"
    - name: Run the role's input checks
      ansible.builtin.include_role:
        name: "{{ role }}"
        tasks_from: validate.yml
    - name: Record success
      ansible.builtin.set_fact:
        outcomes: "{{ outcomes | combine({case: 'ok'}) }}"
  rescue:
    - name: Record the refusal
      ansible.builtin.set_fact:
        outcomes: "{{ outcomes | combine({case: refusal}) }}"
      vars:
        # A looped assert reports per item.
        refusal: >-
          {{ (ansible_failed_result.results | default([]) | selectattr('failed', 'defined') | selectattr('failed')
              | map(attribute='msg') | join(' ')) or ansible_failed_result.msg }}
"""

PLAYBOOK = """
- name: Input checks
  hosts: localhost
  gather_facts: false
  vars:
    outcomes: {}
  tasks:
    - name: Each case
      ansible.builtin.include_tasks: case.yml
      loop: "{{ cases }}"
      loop_control:
        loop_var: case
    - name: Write the outcomes
      ansible.builtin.copy:
        content: "{{ outcomes | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""


def run_cases(tmp_path: Path, role: str, baseline: dict, cases: dict[str, dict]) -> dict[str, str]:
    """Runs every case through the role's checks in one ansible-playbook run; returns 'ok' or the refusal."""
    (tmp_path / "case.yml").write_text(CASE_TASKS)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    for name, settings in cases.items():
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump({**baseline, **settings}))
    out = tmp_path / "out.json"
    extra = {"role": role, "out": str(out), "case_dir": str(tmp_path), "cases": list(cases)}
    (tmp_path / "extra.yml").write_text(yaml.safe_dump(extra))
    inventory = write_inventory(tmp_path / "inventory", {"localhost": LOCAL_HOST}, {})
    extra_vars = f"-e @{tmp_path / 'extra.yml'}"
    run = run_playbook(tmp_path / "play.yml", inventory, extra_vars, private_dir=tmp_path / "runner")
    assert run.rc == 0, run.output[-3000:]
    return json.loads(out.read_text())


CIDRS = ["10.213.50.0/24"]
MEMBERS = {"node1": "10.213.50.11", "node2": "10.213.50.12"}
SERVER_BASELINE = {
    "nfs_server_allowed_cidrs": CIDRS,
    "nfs_server_export_to": "members",
    "nfs_server_members": MEMBERS,
    "nfs_server_allow_weak_options": False,
    "nfs_server_exports": [{"path": "/data"}],
    "nfs_server_export_options": ["rw", "sync", "root_squash", "no_subtree_check"],
    "nfs_server_dir_mode": "0755",
    "nfs_server_lease_time": 90,
    "nfs_server_grace_time": 90,
}
CLIENT_BASELINE = {
    "nfs_client_server": "10.213.50.10",
    "nfs_client_export": "/data",
    "nfs_client_mount_point": "/data",
    "nfs_client_nconnect": 4,
    "nfs_client_extra_options": [],
    "nfs_client_nosuid_nodev": True,
}
SERVER_CASES = {
    "cluster": {"nfs_server_allowed_cidrs": CIDRS},
    "two_networks": {
        "nfs_server_allowed_cidrs": ["10.0.0.0/8", "192.168.1.0/24"],
        "nfs_server_members": {"node1": "10.1.2.3", "node2": "192.168.1.7"},
    },
    "to_cidrs_without_members": {"nfs_server_export_to": "cidrs", "nfs_server_members": {}},
    "member_outside": {"nfs_server_members": {**MEMBERS, "node2": "10.213.51.12"}},
    "member_by_name": {"nfs_server_members": {**MEMBERS, "node2": "node2.example"}},
    "member_ipv6": {"nfs_server_members": {**MEMBERS, "node2": "fd00::12"}},
    "no_member": {"nfs_server_members": {}},
    "export_to_everyone": {"nfs_server_export_to": "everyone"},
    "no_root_squash": {"nfs_server_export_options": ["rw", "sync", "no_root_squash"]},
    "insecure_in_export": {"nfs_server_exports": [{"path": "/data", "options": ["rw", "insecure"]}]},
    "all_squash": {"nfs_server_export_options": ["rw", "sync", "all_squash"]},
    "weak_meant": {
        "nfs_server_export_options": ["rw", "sync", "no_root_squash", "insecure", "all_squash"],
        "nfs_server_allow_weak_options": True,
    },
    "star": {"nfs_server_allowed_cidrs": ["*"]},
    "star_in_export": {
        "nfs_server_allowed_cidrs": CIDRS,
        "nfs_server_exports": [{"path": "/data", "cidrs": ["10.0.0.0/8", "*"]}],
    },
    "no_client": {"nfs_server_allowed_cidrs": []},
    "everyone": {"nfs_server_allowed_cidrs": ["0.0.0.0/0"]},
    "prefix_33": {"nfs_server_allowed_cidrs": ["10.213.50.0/33"]},
    "octet_256": {"nfs_server_allowed_cidrs": ["10.256.50.0/24"]},
    "no_prefix": {"nfs_server_allowed_cidrs": ["10.213.50.0"]},
    "hostname": {"nfs_server_allowed_cidrs": ["node1.example/24"]},
    "option_injection": {"nfs_server_allowed_cidrs": CIDRS, "nfs_server_export_options": ["rw) *(rw"]},
    "relative_path": {"nfs_server_allowed_cidrs": CIDRS, "nfs_server_exports": [{"path": "data"}]},
    "bad_mode": {"nfs_server_allowed_cidrs": CIDRS, "nfs_server_dir_mode": "rwx"},
    "short_lease": {"nfs_server_allowed_cidrs": CIDRS, "nfs_server_lease_time": 5},
    "fast_recovery": {"nfs_server_allowed_cidrs": CIDRS, "nfs_server_lease_time": 10, "nfs_server_grace_time": 10},
}
CLIENT_CASES = {
    "cluster": {"nfs_client_server": "10.213.50.10", "nfs_client_export": "/data"},
    "by_name": {"nfs_client_server": "node0", "nfs_client_export": "/data"},
    "no_server": {"nfs_client_server": "", "nfs_client_export": "/data"},
    "relative_export": {"nfs_client_server": "node0", "nfs_client_export": "data"},
    "root_mount_point": {"nfs_client_server": "node0", "nfs_client_export": "/data", "nfs_client_mount_point": "/"},
    "nconnect_32": {"nfs_client_server": "node0", "nfs_client_export": "/data", "nfs_client_nconnect": 32},
    "option_with_comma": {
        "nfs_client_server": "node0",
        "nfs_client_export": "/data",
        "nfs_client_extra_options": ["noatime,nolock"],
    },
    "undoes_nosuid": {"nfs_client_extra_options": ["noatime", "suid"]},
    "undoes_nodev": {"nfs_client_extra_options": ["dev"]},
    "suid_meant": {"nfs_client_nosuid_nodev": False, "nfs_client_extra_options": ["suid"]},
}


@pytest.fixture(scope="module")
def server_outcomes(tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp("nfs_server"), "nfs_server", SERVER_BASELINE, SERVER_CASES)


@pytest.fixture(scope="module")
def client_outcomes(tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp("nfs_client"), "nfs_client", CLIENT_BASELINE, CLIENT_CASES)


@pytest.mark.parametrize("case", ["cluster", "two_networks", "fast_recovery", "to_cidrs_without_members"])
def test_server_accepts_cluster_cidrs(server_outcomes, case):
    assert server_outcomes[case] == "ok"


@pytest.mark.parametrize("case", ["star", "star_in_export", "no_client"])
def test_server_refuses_exports_open_to_everyone(server_outcomes, case):
    assert "never `*`" in server_outcomes[case]


@pytest.mark.parametrize("case", ["everyone", "prefix_33", "octet_256", "no_prefix", "hostname"])
def test_server_refuses_malformed_cidrs(server_outcomes, case):
    assert "IPv4 CIDRs with a prefix of 1-32" in server_outcomes[case]
    assert SERVER_CASES[case]["nfs_server_allowed_cidrs"][0] in server_outcomes[case]


@pytest.mark.parametrize("case", ["option_injection", "relative_path", "bad_mode", "short_lease"])
def test_server_refuses_bad_paths_options_and_modes(server_outcomes, case):
    assert server_outcomes[case] != "ok"
    assert server_outcomes[case].startswith("nfs_server:")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("member_outside", "cluster_address=10.213.51.12 on node2 is not in nfs_server_allowed_cidrs (10.213.50.0/24)"),
        ("member_by_name", "cluster_address=node2.example on node2: not an IP address"),
        ("member_ipv6", "cluster_address=fd00::12 on node2 is not in nfs_server_allowed_cidrs"),
    ],
)
def test_server_refuses_a_member_outside_the_cluster_cidrs_naming_it(server_outcomes, case, expected):
    assert server_outcomes[case].startswith("nfs_server: the exports go to each host of group nfs_clients")
    assert expected in server_outcomes[case]


def test_server_refuses_members_mode_without_members(server_outcomes):
    assert "never `*` or no client at all" in server_outcomes["no_member"]
    assert "put the hosts that mount it in group nfs_clients" in server_outcomes["no_member"]


def test_server_refuses_an_unknown_export_to(server_outcomes):
    assert "nfs_server_export_to must be members" in server_outcomes["export_to_everyone"]


@pytest.mark.parametrize(
    ("case", "option"),
    [("no_root_squash", "no_root_squash"), ("insecure_in_export", "insecure"), ("all_squash", "all_squash")],
)
def test_server_refuses_weakening_options_unless_meant(server_outcomes, case, option):
    assert f"entry '{option}' on localhost: weakens root squashing" in server_outcomes[case]
    assert server_outcomes["weak_meant"] == "ok"


@pytest.mark.parametrize("case", ["cluster", "by_name", "suid_meant"])
def test_client_accepts_a_server_and_export(client_outcomes, case):
    assert client_outcomes[case] == "ok"


@pytest.mark.parametrize(
    "case",
    ["no_server", "relative_export", "root_mount_point", "nconnect_32", "option_with_comma", "undoes_nosuid"],
)
def test_client_refuses_bad_mount_settings(client_outcomes, case):
    assert client_outcomes[case].startswith("nfs_client:")


@pytest.mark.parametrize(("case", "option"), [("undoes_nosuid", "suid"), ("undoes_nodev", "dev")])
def test_client_refuses_extra_options_that_undo_nosuid_nodev(client_outcomes, case, option):
    assert f"holds {option}, which undoes nosuid,nodev" in client_outcomes[case]
