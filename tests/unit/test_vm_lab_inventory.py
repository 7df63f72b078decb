"""inventory/vm-lab, the lab's checked-in inventory (tests/lab/lab.sh): inventory/lab's group_vars under it, its
own differences read last, and the values the e2e tests rely on."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VM_LAB = ROOT / "inventory" / "vm-lab"
LAB_VARS = ROOT / "inventory" / "lab" / "group_vars" / "all"
OVERRIDES = "zz-vm-lab.yml"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import lab  # noqa: E402


def test_every_group_vars_file_of_inventory_lab_is_linked_and_the_lab_overrides_come_last():
    linked = VM_LAB / "group_vars" / "all"
    names = sorted(p.name for p in linked.iterdir())
    assert names[-1] == OVERRIDES, f"{OVERRIDES} must sort after every linked file, or they override it: {names}"
    for source in sorted(LAB_VARS.glob("*.yml")):
        link = linked / source.name
        assert link.is_symlink(), f"{link} is not a link to {source}: the lab would not follow inventory/lab"
        assert not link.readlink().is_absolute(), f"{link} is an absolute link"
        assert link.resolve() == source.resolve()
    assert {p.name for p in linked.iterdir()} == {p.name for p in LAB_VARS.glob("*.yml")} | {OVERRIDES}


def test_the_generated_ports_are_the_only_thing_outside_the_checked_in_inventory():
    host_vars = VM_LAB / "host_vars"
    assert host_vars.is_symlink() and host_vars.readlink() == Path("../../.cache/lab/host_vars")
    assert lab.INVENTORY == VM_LAB and lab.PORTS == (ROOT / ".cache" / "lab" / "host_vars")


def test_the_e2e_tests_names_agree_with_the_inventory():
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    env.pop("DDP_LAB_STEPS", None)
    ansible = Path(sys.executable).parent / "ansible"
    graph = subprocess.run(
        [str(ansible) + "-inventory", "-i", str(VM_LAB), "--list"], env=env, capture_output=True, text=True, check=True
    )
    groups = json.loads(graph.stdout)
    assert groups["cluster"]["hosts"] == list(lab.NODES)
    assert groups["nfs_server"]["hosts"] == [lab.SERVER] and groups["nfs_clients"]["hosts"] == [lab.CLIENT]
    shown = subprocess.run(
        [str(ansible), "-i", str(VM_LAB), lab.SERVER, "-m", "ansible.builtin.debug", "-a", "var=train_job_name"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"train_job_name: {lab.JOB}" in shown.stdout, shown.stdout
