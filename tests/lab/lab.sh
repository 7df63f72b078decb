#!/usr/bin/env bash
# The lab: the whole flow on two real-kernel QEMU VMs on this machine (the VM tier of the tests).
#   tests/lab/lab.sh up       boot lab-node0 and lab-node1 (the hosts of inventory/vm-lab), write their SSH ports
#   tests/lab/lab.sh site     ansible-playbook site.yml against them (every stage; the GPU stack GPU-less)
#   tests/lab/lab.sh train    make train across both VMs: docker runtime, checkpoints on the NFS share
#   tests/lab/lab.sh down     stop the VMs, remove their overlays and the ports
#   tests/lab/lab.sh inventory  rewrite the running VMs' SSH ports (.cache/lab/host_vars) from vmctl's state
#   tests/lab/lab.sh all      up, site, train (what `make lab` runs); each phase prints its time
# The inventory is inventory/vm-lab (checked in): inventory/lab's groups and group_vars, the VMs' addresses and
# the settings a CPU-only lab needs; only each boot's SSH port forwards are written here. Environment:
# DDP_VM_MEMORY (MiB, 3072 here), DDP_VM_CPUS (1), DDP_VM_ACCEL (kvm|tcg; detected: a laptop with KVM runs the
# lab several times faster); read by the inventory when a play runs: DDP_LAB_STEPS (30), DDP_LAB_IFNAME (ens2).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir="$repo/.cache/lab"
inventory="$repo/inventory/vm-lab"
vmctl="$repo/molecule/vm/vmctl.sh"
venv_bin="$repo/.venv/bin"
set_name=lab
# Baked into the VM image natively: the guests reach no mirror, and apt under TCG is slow. The roles still
# run their install steps (they find the packages present); their own scenarios prove the installs.
export DDP_VM_EXTRA_PACKAGES="docker.io apparmor python3-requests nftables"
export DDP_VM_DISK_SIZE=12G
export DDP_VM_MEMORY=${DDP_VM_MEMORY:-3072}
export ANSIBLE_CONFIG="$repo/ansible.cfg"

phase() {
  local name=$1 started=$SECONDS
  shift
  echo "=== lab: $name"
  "$@"
  echo "=== lab: $name: $((SECONDS - started)) s"
}

# The one part of the inventory a boot decides: each VM's SSH port forward (vmctl.sh picks a free port), as
# ansible_port in .cache/lab/host_vars, which inventory/vm-lab/host_vars links to.
write_inventory() {
  rm -rf "$lab_dir/host_vars"
  "$venv_bin/python" - "$repo/.cache/vm/run/$set_name/instances.json" "$lab_dir/host_vars" <<'PY'
import json
import sys
from pathlib import Path

host_vars = Path(sys.argv[2])
host_vars.mkdir(parents=True, exist_ok=True)
for vm in json.load(open(sys.argv[1])):
    (host_vars / f"{vm['instance']}.yml").write_text(
        f"---\n# Written by tests/lab/lab.sh up: this boot's SSH port forward.\nansible_port: {int(vm['port'])}\n"
    )
PY
  echo "inventory: $inventory (ports in $lab_dir/host_vars)"
}

# The training image, built and saved by the train_image role's own build step (tests/lab/image.yml): under the
# role's archive name, which the VM image preloads, as `docker load` of it under TCG takes tens of minutes. The
# role then finds the same image ID on both VMs and copies nothing; its own scenario proves the copy and the load.
training_image_archive() {
  "$repo/tests/host/ensure-docker.sh" >&2
  mkdir -p "$lab_dir"
  (cd "$repo" && "$venv_bin/ansible-playbook" -i "$inventory" tests/lab/image.yml \
    -e "lab_image_archive_path=$lab_dir/image-archive") >&2
  cat "$lab_dir/image-archive"
}

# NAME=ADDRESS for each VM: the hosts of the inventory's cluster group and their cluster_address.
vm_specs() {
  "$venv_bin/python" - "$inventory/hosts.yml" <<'PY'
import sys

import yaml

hosts = yaml.safe_load(open(sys.argv[1]))["all"]["children"]["cluster"]["hosts"]
print(" ".join(f"{name}={host['cluster_address']}" for name, host in hosts.items()))
PY
}

up() {
  local specs first
  local -a vms
  specs=$(vm_specs)
  read -ra vms <<<"$specs"
  "$repo/molecule/vm/ensure-qemu.sh"
  DDP_VM_DOCKER_ARCHIVES=$(training_image_archive)
  export DDP_VM_DOCKER_ARCHIVES
  # The cluster network's /24 (the first VM's address without its last byte).
  first=${vms[0]#*=}
  DDP_VM_SUBNET=${first%.*} "$vmctl" up "$set_name" "${vms[@]}"
  write_inventory
}

site() {
  (cd "$repo" && "$venv_bin/ansible-playbook" -i "$inventory" site.yml "$@")
}

train() {
  make -C "$repo" --no-print-directory train INVENTORY="$inventory" "$@"
}

down() {
  "$vmctl" down "$set_name"
  rm -rf "$lab_dir"
}

case "${1:-}" in
  up) phase "VMs up" up ;;
  inventory) write_inventory ;;
  site) shift; phase "site.yml" site "$@" ;;
  train) shift; phase "training" train "$@" ;;
  down) phase "VMs down" down ;;
  all)
    started=$SECONDS
    phase "VMs up" up
    phase "site.yml" site
    phase "training" train
    echo "=== lab: total $((SECONDS - started)) s; artifacts under $repo/artifacts; make lab-down removes the VMs"
    ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
