"""`make bench-scale` (by hand, not in CI): how provisioning time grows with the node count.

    python tests/scale/bench_scale.py [--nodes 2 4 8] [--stages preflight trust ssh firewall container]

For each node count it starts that many systemd test hosts (molecule/shared/create.yml, the one definition of a
test host), runs the container-tier stages of site.yml one playbook at a time, then every stage again (the
no-op rerun, whose changed count must be 0), and removes the hosts. Writes
artifacts/bench-scale-<time>/scale.json and prints wall seconds per stage against node count. The NFS and GPU
stages need a kernel NFS server and GPUs, which test hosts lack; `container` (a Docker engine and the
training image loaded on every host) is off by default: loading the image into each nested engine dominates
it and grows linearly, as the train_image scenario already shows for two hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from lab import recap  # the e2e tier's reader of a play's recap (tests/e2e is no package)

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "ansible" / "playbooks"
CREATE = ROOT / "molecule" / "shared" / "create.yml"
CLEANUP = ROOT / "molecule" / "cleanup.sh"
# create.yml labels the hosts with the basename of this directory, so cleanup.sh removes exactly them.
LABEL = "bench_scale"
# The test run's network (`make bench-scale` makes it: molecule/testrun.sh).
SUBNET = f"{os.environ['DDP_TEST_NET']}.0/24"
DEFAULT_STAGES = ["preflight", "trust", "ssh", "firewall"]


def ansible_env() -> dict[str, str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), MOLECULE_PROJECT_DIRECTORY=f"/{LABEL}")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def playbook(path: Path, inventory: Path, *extra: str) -> tuple[float, int]:
    """Wall seconds and the changed count over all hosts; raises with the play's tail on failure."""
    started = time.monotonic()
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(path), *extra],
        cwd=ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return seconds, sum(counts["changed"] for counts in recap(proc.stdout).values())


def start_hosts(names: list[str], workdir: Path) -> tuple[float, dict[str, str]]:
    """Boot seconds, and each host's container (create.yml's instance config: instance -> address)."""
    platforms = {"platforms": [{"name": name, "groups": ["cluster", "training"]} for name in names]}
    instances = workdir / "instances.yml"
    extra = {"molecule_yml": platforms, "molecule_instance_config": str(instances)}
    local = workdir / "localhost.ini"
    local.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    seconds, _ = playbook(CREATE, local, "-e", json.dumps(extra))
    return seconds, {entry["instance"]: entry["address"] for entry in yaml.safe_load(instances.read_text())}


def address(container: str) -> str:
    """A test host's address on the run's network, its only one."""
    template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    return subprocess.run(
        ["docker", "inspect", "-f", template, container], capture_output=True, text=True, check=True
    ).stdout.strip()


def write_inventory(containers: dict[str, str], path: Path) -> None:
    """The lab's inventory settings (inventory/lab/group_vars), on test hosts: their network, no GPUs."""
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", path.parent / "group_vars")
    # Host variables, because group_vars/all beside an inventory outranks the inventory file's own group vars.
    test_host = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "cluster_cidrs": [SUBNET],
        "admin_cidrs": [SUBNET],
        # A container may not set the kernel's ephemeral port range (the lab's mode); the role's default may.
        "firewall_data_ports_mode": "cluster_wide",
        "docker_source": "distribution",
        "train_image_name": "ddp-train:cpu",
        "train_image_variant": "cpu",
        "train_nproc_per_node": 1,
        "train_config": "{{ train_code_dir }}/configs/cpu-smoke.yaml",
    }
    names = list(containers)
    hosts = {
        name: {**test_host, "ansible_host": container, "cluster_address": address(container)}
        for name, container in containers.items()
    }
    inventory = {
        "all": {
            # The NFS stage does not run here, but preflight checks the whole inventory, storage layout included.
            "children": {
                "cluster": {"hosts": hosts},
                "training": {"hosts": dict.fromkeys(names)},
                "nfs_server": {"hosts": dict.fromkeys(names[:1])},
                "nfs_clients": {"hosts": dict.fromkeys(names[1:])},
            },
        }
    }
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))


def measure(count: int, stages: list[str]) -> dict[str, Any]:
    names = [f"scale-node{i}" for i in range(count)]
    with tempfile.TemporaryDirectory(prefix="ddp-bench-scale-") as tmp:
        workdir = Path(tmp)
        try:
            boot_s, containers = start_hosts(names, workdir)
            inventory = workdir / "inventory.yml"
            write_inventory(containers, inventory)
            converge = {stage: playbook(PLAYBOOKS / f"{stage}.yml", inventory)[0] for stage in stages}
            rerun = {stage: playbook(PLAYBOOKS / f"{stage}.yml", inventory) for stage in stages}
        finally:
            subprocess.run([str(CLEANUP), LABEL], check=False, capture_output=True)
    return {
        "nodes": count,
        "boot_s": round(boot_s, 1),
        "converge_s": {stage: round(s, 1) for stage, s in converge.items()},
        "rerun_s": {stage: round(s, 1) for stage, (s, _) in rerun.items()},
        "rerun_changed": sum(changed for _, changed in rerun.values()),
    }


def table(results: list[dict[str, Any]], stages: list[str]) -> str:
    header = f"{'nodes':>5}  " + "  ".join(f"{stage:>9}" for stage in stages) + f"  {'total':>7}  {'rerun':>7}  changed"
    lines = [header]
    for row in results:
        converge = row["converge_s"]
        cells = "  ".join(f"{converge[stage]:>9.1f}" for stage in stages)
        total, rerun = sum(converge.values()), sum(row["rerun_s"].values())
        lines.append(f"{row['nodes']:>5}  {cells}  {total:>7.1f}  {rerun:>7.1f}  {row['rerun_changed']:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--stages", nargs="+", default=DEFAULT_STAGES, choices=[*DEFAULT_STAGES, "container"])
    args = parser.parse_args(argv)
    out = ROOT / "artifacts" / time.strftime("bench-scale-%Y%m%d-%H%M%S", time.gmtime())
    out.mkdir(parents=True)
    results = []
    for count in args.nodes:
        print(f"- {count} test hosts: {', '.join(args.stages)}, then the same again (no-op rerun)", flush=True)
        results.append(measure(count, args.stages))
        (out / "scale.json").write_text(json.dumps({"cores": os.cpu_count(), "runs": results}, indent=2) + "\n")
    print("wall seconds per stage (converge), and the whole rerun")
    print(table(results, args.stages))
    print(f"scale.json: {out / 'scale.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
