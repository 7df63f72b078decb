#!/usr/bin/env bash
# Boots and removes sets of Debian 12 QEMU VMs with the distribution kernel: the VM tier of the tests, and
# the machines `make lab` provisions. Each VM has two NICs:
#   - the cluster NIC on a private L2 network shared by the set's VMs only (QEMU multicast socket on the
#     host's loopback), static addresses in DDP_VM_SUBNET; nothing else is on it and it routes nowhere;
#   - an SSH NIC: user-mode networking with restrict=on (the guest reaches no outside address) and one port
#     forward, 127.0.0.1:<port> -> guest:22, for Ansible.
# Every VM has a copy-on-write overlay over the cached base image (image.sh), its own SSH host key made here
# (pinned in the set's known_hosts) and a seed disk carrying its hostname, addresses and keys.
#
#   vmctl.sh up SET NAME[=ADDRESS] ...   boot the set (replacing one left behind), wait until SSH answers
#   vmctl.sh down SET                    stop the set's VMs, remove overlays, keys and state
#   vmctl.sh down-all [PREFIX]           every set (or those whose name starts with PREFIX)
#   vmctl.sh ssh SET NAME [COMMAND...]   log in to a VM (pinned host key)
#   vmctl.sh accel                       the accelerator VMs get here: kvm if a KVM guest really runs, else tcg
#
# State of a set: .cache/vm/run/SET/ (instances.json lists name, port, address, identity_file, known_hosts).
# Environment: DDP_VM_MEMORY (MiB, 1024), DDP_VM_CPUS (1), DDP_VM_ACCEL (kvm|tcg, skips detection),
#   DDP_VM_CPU (QEMU -cpu; max under TCG, host under KVM), DDP_VM_SUBNET (10.213.50: VMs without =ADDRESS
#   get .10, .11, ...), DDP_VM_BOOT_TIMEOUT (s, 300); image.sh's DDP_VM_EXTRA_PACKAGES and DDP_VM_DISK_SIZE.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DDP_VM_CACHE:-$repo/.cache/vm}
memory=${DDP_VM_MEMORY:-1024}
cpus=${DDP_VM_CPUS:-1}
subnet=${DDP_VM_SUBNET:-10.213.50}
boot_timeout=${DDP_VM_BOOT_TIMEOUT:-300}

die() { echo "vmctl: $*" >&2; exit 1; }
log() { echo "vmctl: $*" >&2; }

set_dir() {
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "bad set name '$1' (letters, digits, _ . -)"
  echo "$cache/run/$1"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_'"$1"'); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# KVM is used only when a guest really runs under it: /dev/kvm can exist while guests hang (nested
# virtualization without the CPU feature). A kernel that boots to its "no root" panic proves it; the
# verdict is kept until the host reboots.
accel() {
  if [ -n "${DDP_VM_ACCEL:-}" ]; then echo "$DDP_VM_ACCEL"; return; fi
  local boot_id verdict=tcg probe image
  boot_id=$(cat /proc/sys/kernel/random/boot_id)
  if [ -f "$cache/accel" ] && [ "$(cut -d' ' -f1 "$cache/accel")" = "$boot_id" ]; then
    cut -d' ' -f2 "$cache/accel"
    return
  fi
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    image=$("$here/image.sh")
    probe=$(mktemp)
    timeout -s KILL 20 qemu-system-x86_64 -accel kvm -cpu host -m 256 -nodefaults -no-user-config \
      -display none -serial "file:$probe" -no-reboot -kernel "$image/vmlinuz" \
      -append "console=ttyS0 panic=-1" >/dev/null 2>&1 || true
    grep -q "Kernel panic" "$probe" && verdict=kvm
    rm -f "$probe"
  fi
  mkdir -p "$cache"
  echo "$boot_id $verdict" >"$cache/accel"
  log "accelerator: $verdict (detected once per host boot; DDP_VM_ACCEL overrides)"
  echo "$verdict"
}

# The pid belongs to this set's QEMU (and not to a process that reused the number).
ours() {
  local pid=$1 tag=$2
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "-name $tag "
}

down() {
  local dir pidfile pid tag
  dir=$(set_dir "$1")
  [ -d "$dir" ] || return 0
  for pidfile in "$dir"/*/qemu.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    tag="ddp-vm-$1-$(basename "$(dirname "$pidfile")")"
    if ours "$pid" "$tag"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do ours "$pid" "$tag" || break; sleep 0.1; done
      ours "$pid" "$tag" && kill -9 "$pid" 2>/dev/null
      log "stopped $tag"
    fi
  done
  rm -rf "$dir"
}

ssh_opts() {
  local dir=$1 port=$2
  echo "-o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=$dir/known_hosts" \
    "-o IdentitiesOnly=yes -o ConnectTimeout=5 -o LogLevel=ERROR -i $dir/id_ed25519 -p $port"
}

make_seed() {
  local vm=$1 name=$2 address=$3 index=$4 authorized=$5
  local root="$vm/seed/rootfs"
  mkdir -p "$root/etc/ssh" "$root/etc/systemd/network" "$root/root/.ssh"
  chmod 0700 "$root/root" "$root/root/.ssh"
  echo "$name" >"$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n' "$address" "$name" \
    >"$root/etc/hosts"
  cp "$vm/hostkey" "$root/etc/ssh/ssh_host_ed25519_key"
  cp "$vm/hostkey.pub" "$root/etc/ssh/ssh_host_ed25519_key.pub"
  chmod 0600 "$root/etc/ssh/ssh_host_ed25519_key"
  install -m 0600 "$authorized" "$root/root/.ssh/authorized_keys"
  # The cluster NIC carries the default route, so facts name it as a single-homed node's address; nothing
  # holds the gateway address, so traffic for anywhere else goes nowhere.
  cat >"$root/etc/systemd/network/10-ddp-cluster.network" <<EOF
[Match]
MACAddress=$(mac 1 "$index")

[Network]
Address=$address/24
Gateway=$subnet.1
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
  cat >"$root/etc/systemd/network/20-ddp-ssh.network" <<EOF
[Match]
MACAddress=$(mac 2 "$index")

[Network]
Address=10.0.2.15/24
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
  mke2fs -q -t ext4 -L ddp-seed -d "$vm/seed" "$vm/seed.img" 8M >/dev/null
}

mac() { printf '52:54:00:d5:%02x:%02x' "$1" "$2"; }

up() {
  local set=$1; shift
  [ $# -gt 0 ] || die "usage: vmctl.sh up SET NAME[=ADDRESS] ..."
  local dir image accel_kind cpu group_port index=0 spec name address vm port started=$SECONDS
  dir=$(set_dir "$set")
  down "$set"
  # Interrupted while booting: leave nothing running.
  trap 'down "$set"; exit 130' INT TERM
  "$here/ensure-qemu.sh"
  image=$("$here/image.sh")
  accel_kind=$(accel)
  cpu=${DDP_VM_CPU:-max}
  [ "$accel_kind" = kvm ] && cpu=${DDP_VM_CPU:-host}
  mkdir -p "$dir"
  ssh-keygen -q -t ed25519 -N '' -C "ddp-vm-$set" -f "$dir/id_ed25519"
  : >"$dir/known_hosts"
  # The set's private L2 network: a multicast group on the host's loopback, on a port no other set uses.
  group_port=$(free_port DGRAM)
  local -a names=() ports=() addresses=()
  for spec in "$@"; do
    name=${spec%%=*}
    address=$subnet.$((10 + index))
    [[ $spec == *=* ]] && address=${spec#*=}
    [[ $name =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "bad VM name '$name' (a hostname: a-z 0-9 -)"
    vm="$dir/$name"
    mkdir -p "$vm"
    ssh-keygen -q -t ed25519 -N '' -C "$name" -f "$vm/hostkey"
    port=$(free_port STREAM)
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$vm/hostkey.pub")" >>"$dir/known_hosts"
    make_seed "$vm" "$name" "$address" "$index" "$dir/id_ed25519.pub"
    qemu-img create -q -f qcow2 -F raw -b "$image/rootfs.ext4" "$vm/overlay.qcow2"
    qemu-system-x86_64 -name "ddp-vm-$set-$name" \
      -machine pc -accel "$accel_kind" -cpu "$cpu" -smp "$cpus" -m "$memory" \
      -nodefaults -no-user-config -display none -vga none \
      -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
      -append "root=/dev/vda rw console=ttyS0 quiet loglevel=3 no_timer_check systemd.show_status=false" \
      -drive "file=$vm/overlay.qcow2,if=virtio,format=qcow2" \
      -drive "file=$vm/seed.img,if=virtio,format=raw,readonly=on" \
      -netdev "socket,id=cluster,mcast=239.213.50.1:$group_port,localaddr=127.0.0.1" \
      -device "virtio-net-pci,netdev=cluster,mac=$(mac 1 "$index")" \
      -netdev "user,id=ssh,restrict=on,hostfwd=tcp:127.0.0.1:$port-:22" \
      -device "virtio-net-pci,netdev=ssh,mac=$(mac 2 "$index")" \
      -device virtio-rng-pci \
      -serial "file:$vm/console.log" -pidfile "$vm/qemu.pid" -daemonize \
      || { down "$set"; die "QEMU did not start $name"; }
    names+=("$name"); ports+=("$port"); addresses+=("$address")
    index=$((index + 1))
  done
  log "booting ${names[*]} ($accel_kind, ${memory} MiB, $cpus vCPU each)"
  local i deadline=$((SECONDS + boot_timeout))
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2046  # options are words
    until ssh $(ssh_opts "$dir" "${ports[$i]}") root@127.0.0.1 true 2>/dev/null; do
      if ! ours "$(cat "$dir/${names[$i]}/qemu.pid")" "ddp-vm-$set-${names[$i]}" || ((SECONDS > deadline)); then
        log "${names[$i]} did not answer on SSH within ${boot_timeout} s; its console ends with:"
        tail -20 "$dir/${names[$i]}/console.log" >&2
        down "$set"
        exit 1
      fi
      sleep 2
    done
  done
  python3 - "$dir" "${names[@]}" -- "${ports[@]}" -- "${addresses[@]}" <<'PY'
import json
import sys
from pathlib import Path

args = sys.argv[2:]
first = args.index("--")
second = args.index("--", first + 1)
names, ports, addresses = args[:first], args[first + 1 : second], args[second + 1 :]
state = Path(sys.argv[1])
instances = [
    {
        "instance": name,
        "address": "127.0.0.1",
        "port": int(port),
        "user": "root",
        "identity_file": str(state / "id_ed25519"),
        "known_hosts": str(state / "known_hosts"),
        "private_address": address,
    }
    for name, port, address in zip(names, ports, addresses, strict=True)
]
(state / "instances.json").write_text(json.dumps(instances, indent=2) + "\n")
PY
  trap - INT TERM
  log "${names[*]} answer on SSH after $((SECONDS - started)) s; state in $dir"
}

down_all() {
  local prefix=${1:-} dir
  for dir in "$cache"/run/"$prefix"*/; do
    [ -d "$dir" ] && down "$(basename "$dir")"
  done
  return 0
}

cmd=${1:-}
shift || true
case "$cmd" in
  up) up "$@" ;;
  down) [ $# -eq 1 ] || die "usage: vmctl.sh down SET"; down "$1" ;;
  down-all) down_all "$@" ;;
  accel) accel ;;
  ssh)
    [ $# -ge 2 ] || die "usage: vmctl.sh ssh SET NAME [COMMAND...]"
    dir=$(set_dir "$1")
    port=$(python3 -c 'import json, sys; print(next(i["port"] for i in json.load(open(sys.argv[1])) if i["instance"] == sys.argv[2]))' "$dir/instances.json" "$2")
    shift 2
    # shellcheck disable=SC2046
    exec ssh $(ssh_opts "$dir" "$port") root@127.0.0.1 "$@"
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
