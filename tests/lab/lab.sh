#!/usr/bin/env bash
# The lab: the whole flow on two real-kernel QEMU VMs on this machine (the VM tier of the tests).
#   tests/lab/lab.sh up       boot lab-node0 and lab-node1, write their inventory (.cache/lab/inventory)
#   tests/lab/lab.sh site     ansible-playbook site.yml against them (every stage; the GPU stack GPU-less)
#   tests/lab/lab.sh train    make train across both VMs: docker runtime, checkpoints on the NFS share
#   tests/lab/lab.sh down     stop the VMs, remove their overlays and the inventory
#   tests/lab/lab.sh inventory  rewrite the inventory of the running VMs (after editing this script)
#   tests/lab/lab.sh all      up, site, train (what `make lab` runs); each phase prints its time
# The inventory has inventory/lab's groups and group_vars, with the VMs' addresses and the settings a CPU-only
# lab needs layered on top (group_vars/all/zz-lab.yml). Environment: DDP_VM_MEMORY (MiB, 3072 here),
# DDP_VM_CPUS (1), DDP_VM_ACCEL (kvm|tcg; detected: a laptop with KVM runs the lab several times faster).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
lab_dir="$repo/.cache/lab"
inventory="$lab_dir/inventory"
vmctl="$repo/molecule/vm/vmctl.sh"
venv_bin="$repo/.venv/bin"
set_name=lab
subnet=10.213.60
# Baked into the VM image natively: the guests reach no mirror, and apt under TCG is slow. The roles still
# run their install steps (they find the packages present); their own scenarios prove the installs.
export DDP_VM_EXTRA_PACKAGES="docker.io apparmor python3-requests nftables"
export DDP_VM_DISK_SIZE=12G
export DDP_VM_MEMORY=${DDP_VM_MEMORY:-3072}
export DDP_VM_SUBNET=$subnet
export ANSIBLE_CONFIG="$repo/ansible.cfg"

phase() {
  local name=$1 started=$SECONDS
  shift
  echo "=== lab: $name"
  "$@"
  echo "=== lab: $name: $((SECONDS - started)) s"
}

write_inventory() {
  local state="$repo/.cache/vm/run/$set_name"
  rm -rf "$inventory"
  mkdir -p "$inventory/group_vars/all"
  cp "$repo"/inventory/lab/group_vars/all/*.yml "$inventory/group_vars/all/"
  "$venv_bin/python" - "$state/instances.json" "$inventory/hosts.yml" <<'PY'
import json
import sys

import yaml

instances = {i["instance"]: i for i in json.load(open(sys.argv[1]))}
first = next(iter(instances.values()))
ssh_args = (
    f"-o UserKnownHostsFile={first['known_hosts']} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes "
    "-o ControlMaster=auto -o ControlPersist=120s"
)
hosts = {
    name: {"ansible_host": "127.0.0.1", "ansible_port": int(i["port"]), "cluster_address": i["private_address"]}
    for name, i in instances.items()
}
inventory = {
    "all": {
        "children": {
            "cluster": {
                "hosts": hosts,
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": first["identity_file"],
                    "ansible_ssh_common_args": ssh_args,
                },
            },
            "nfs_server": {"hosts": {"lab-node0": None}},
            "nfs_clients": {"hosts": {"lab-node1": None}},
            "training": {"hosts": {"lab-node0": None, "lab-node1": None}},
        }
    }
}
with open(sys.argv[2], "w") as out:
    out.write("---\n# Written by tests/lab/lab.sh up: the lab VMs, reached over their SSH port forwards.\n")
    yaml.safe_dump(inventory, out, sort_keys=False)
PY
  cat >"$inventory/group_vars/all/zz-lab.yml" <<YAML
---
# The lab's differences from inventory/lab (loaded last, so these win): the VMs' network, no GPUs, the CPU image.
cluster_cidrs: [$subnet.0/24]
# QEMU's user-mode network: the controller's SSH reaches the VMs from 10.0.2.2.
admin_cidrs: [$subnet.0/24, 10.0.2.2/32]
# GPU-less mode: no NVIDIA packages without a GPU (the VMs have neither a GPU nor a route to NVIDIA's repository).
gpu_stack_libraries_without_gpu: false
gpu_count: 0
docker_source: distribution
train_image_name: ddp-train:cpu
train_image_variant: cpu
train_job_name: lab
train_config: /opt/ddp/train/configs/cpu-smoke.yaml
train_steps: ${DDP_LAB_STEPS:-30}
# The smoke config with a narrower network and smaller batches (a step takes ~0.6 s instead of ~5 s under TCG),
# and a checkpoint every 10 steps, so a fault mid-run always has a saved checkpoint behind it.
train_program_args:
  - --config
  - "{{ train_config }}"
  - --steps
  - "{{ train_steps }}"
  - --checkpoint-dir
  - "{{ train_checkpoint_dir }}"
  - --output-dir
  - "{{ train_output_dir }}"
  - --resume
  - "{{ train_resume }}"
  - --checkpoint-every
  - "10"
  - --set
  - model.width=8
  - --set
  - data.batch_size=16
train_cpu_nproc_per_node: 1
train_poll_interval_s: 3
# Everything is ~30x slower under TCG: give a node more time before its silence counts as a failure.
train_stale_after_s: 90
# An NFS server restart stalls new opens for the grace period; the default 90 s would stall the job as long.
nfs_server_lease_time: 15
nfs_server_grace_time: 15
train_env:
  OMP_NUM_THREADS: "1"
  GLOO_SOCKET_IFNAME: ${DDP_LAB_IFNAME:-ens2}
YAML
  echo "inventory: $inventory"
}

# The training image, built here as the train_image role builds it, saved under the name the role gives its
# archive, and preloaded into the VM image: `docker load` of it under TCG takes tens of minutes. The role then
# finds the same image ID on both VMs and copies nothing; its own scenario proves the copy and the load.
training_image_archive() {
  local id archive
  "$repo/tests/host/ensure-docker.sh" >&2
  id=$("$repo/container/build.sh" cpu ddp-train:cpu | tail -1 | cut -d' ' -f2)
  archive="$repo/.cache/images/ddp-train_cpu-$(cut -c8-23 <<<"$id").tar"
  if [ ! -s "$archive" ]; then
    mkdir -p "$(dirname "$archive")"
    docker save --output "$archive.part" ddp-train:cpu
    mv "$archive.part" "$archive"
  fi
  echo "$archive"
}

up() {
  "$repo/molecule/vm/ensure-qemu.sh"
  DDP_VM_DOCKER_ARCHIVES=$(training_image_archive)
  export DDP_VM_DOCKER_ARCHIVES
  "$vmctl" up "$set_name" "lab-node0=$subnet.10" "lab-node1=$subnet.11"
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
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
