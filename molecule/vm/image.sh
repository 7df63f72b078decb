#!/usr/bin/env bash
# Builds the VM tier's Debian 12 base image natively (debootstrap + chroot apt, never apt inside an emulated
# guest): an ext4 root filesystem made with `mke2fs -d`, plus the kernel and initrd for direct kernel boot.
# Nothing in it is per-VM: hostname, addresses, SSH host key and authorized key come from each VM's seed disk
# (vmctl.sh), copied over the root filesystem by the initrd (scripts/local-bottom/ddp-seed) at each boot.
# The image is rebuilt only when the recipe changes: its directory name carries the recipe's hash.
#   usage: molecule/vm/image.sh            prints the image directory (rootfs.ext4, vmlinuz, initrd.img)
#   env:   DDP_VM_EXTRA_PACKAGES="pkg ..."  more packages baked in (part of the hash)
#          DDP_VM_DISK_SIZE=6G              root filesystem size (part of the hash; the file is sparse)
#          DDP_VM_DOCKER_ARCHIVES="a.tar ..."  `docker save` archives preloaded into the image's /var/lib/docker
#                                           (needs docker.io among the extra packages, and dockerd here; the
#                                           archive names are part of the hash, so name them by image ID)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DDP_VM_CACHE:-$repo/.cache/vm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
disk_size=${DDP_VM_DISK_SIZE:-6G}
# What the roles and the tests need, installed natively: apt inside a TCG guest is several times slower, and
# the guests have no route to a mirror anyway.
packages=(
  linux-image-amd64 initramfs-tools lz4 systemd systemd-sysv udev dbus
  openssh-server python3 python3-apt sudo
  nfs-kernel-server nfs-common
  iproute2 iputils-ping netcat-openbsd procps kmod e2fsprogs less ca-certificates
)
# shellcheck disable=SC2206  # a word list on purpose
extra=(${DDP_VM_EXTRA_PACKAGES:-})
# shellcheck disable=SC2206
archives=(${DDP_VM_DOCKER_ARCHIVES:-})
archive_names=$(for a in "${archives[@]}"; do basename "$a"; done)
recipe_hash=$( (cat "$here/image.sh"; echo "${extra[*]:-}" "$disk_size" $archive_names) | sha256sum | cut -c1-12)
image_dir="$cache/images/debian12-$recipe_hash"

is_built() { [ -s "$image_dir/rootfs.ext4" ] && [ -s "$image_dir/vmlinuz" ] && [ -s "$image_dir/initrd.img" ]; }
if is_built; then echo "$image_dir"; exit 0; fi

command -v debootstrap >/dev/null || { echo "debootstrap is missing: molecule/vm/ensure-qemu.sh" >&2; exit 1; }
mkdir -p "$cache/images"
# Two runs needing the same image wait for one build instead of both building it.
exec 9>"$cache/images/.lock-$recipe_hash"
flock 9
if is_built; then echo "$image_dir"; exit 0; fi
work=$(mktemp -d "$cache/images/.build-$recipe_hash.XXXXXX")
rootfs="$work/rootfs"
log="$work/build.log"
bake_pid=
cleanup() {
  [ -n "$bake_pid" ] && kill "$bake_pid" 2>/dev/null && wait "$bake_pid" 2>/dev/null
  for m in dev/pts dev proc sys; do mountpoint -q "$rootfs/$m" 2>/dev/null && umount -l "$rootfs/$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "image build failed: $1 (last lines of $log follow)" >&2; tail -25 "$log" >&2; exit 1; }

start=$SECONDS
echo "building VM image debian12-$recipe_hash (debootstrap, kernel and packages natively; a few minutes)" >&2
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$log" 2>&1 || fail debootstrap

# Packages go in through the chroot's own apt, with services kept from starting on this host.
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
mount --bind /dev "$rootfs/dev"
mount --bind /dev/pts "$rootfs/dev/pts"
mount -t proc proc "$rootfs/proc"
mount -t sysfs sysfs "$rootfs/sys"
# A small initrd boots faster under TCG: only the modules this virtual machine needs, lz4-compressed.
mkdir -p "$rootfs/etc/initramfs-tools/conf.d"
printf 'MODULES=list\nCOMPRESS=lz4\n' >"$rootfs/etc/initramfs-tools/conf.d/ddp-vm.conf"
printf '%s\n' virtio_pci virtio_blk virtio_net ext4 >>"$rootfs/etc/initramfs-tools/modules"
# The VM's seed (second disk, made by vmctl.sh) is copied over the root filesystem from the initrd, before
# systemd starts: it reads the right hostname and machine identity from the first instant, and no unit has
# to wait for the seed disk. The initrd has no cp, so the rootfs's own does the copy.
mkdir -p "$rootfs/etc/initramfs-tools/scripts/local-bottom"
install -m 0755 /dev/stdin "$rootfs/etc/initramfs-tools/scripts/local-bottom/ddp-seed" <<'SCRIPT'
#!/bin/sh
[ "$1" = prereqs ] && exit 0
[ -b /dev/vdb ] || exit 0
mount -t ext4 -o ro /dev/vdb "${rootmnt}/mnt" || exit 0
chroot "${rootmnt}" /bin/cp -a /mnt/rootfs/. /
umount "${rootmnt}/mnt"
SCRIPT
chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  "${packages[@]}" "${extra[@]}" >>"$log" 2>&1 || fail "apt-get install"
chroot "$rootfs" apt-get clean >>"$log" 2>&1
for m in dev/pts dev proc sys; do umount -l "$rootfs/$m"; done
rm -f "$rootfs/usr/sbin/policy-rc.d"

# Images preloaded for the guests' Docker engine: `docker load` of a torch image takes many minutes under TCG,
# seconds here. A second, private dockerd of this host (same Debian docker.io as the guests) loads the archives
# straight into the rootfs's data root; the guest's engine finds them there at boot, under the same image IDs.
bake_images() {
  local run_dir data="$rootfs/var/lib/docker" archive
  # The daemon's sockets live under a short path (a unix socket path holds 107 bytes at most).
  run_dir=$(mktemp -d /tmp/ddp-vm-bake.XXXXXX)
  local sock="$run_dir/docker.sock"
  [ -x "$rootfs/usr/sbin/dockerd" ] || fail "DDP_VM_DOCKER_ARCHIVES needs docker.io in DDP_VM_EXTRA_PACKAGES"
  command -v dockerd >/dev/null || fail "DDP_VM_DOCKER_ARCHIVES needs dockerd on this host (tests/host/ensure-docker.sh)"
  # In a network namespace of its own: this daemon must not touch the host's docker0 or firewall (with
  # --bridge none, dockerd deletes docker0 from the namespace it runs in).
  unshare --net -- dockerd --data-root "$data" --exec-root "$run_dir/exec" --pidfile "$run_dir/pid" \
    -H "unix://$sock" --iptables=false --ip6tables=false --storage-driver overlay2 >>"$log" 2>&1 &
  bake_pid=$!
  for _ in $(seq 60); do docker -H "unix://$sock" info >/dev/null 2>&1 && break; sleep 1; done
  for archive in "${archives[@]}"; do
    docker -H "unix://$sock" load --input "$archive" >>"$log" 2>&1 || fail "docker load $archive"
  done
  kill "$bake_pid"
  wait "$bake_pid" 2>/dev/null || true
  bake_pid=
  rm -rf "$run_dir"
  # Only the images: the guest's engine makes its own networks and state.
  rm -rf "$data"/{network,containerd,containers,tmp,runtimes,swarm}
}
if ((${#archives[@]})); then bake_images; fi

# The kernel and initrd are booted directly (-kernel/-initrd); the rootfs keeps its copy for the modules.
cp "$(readlink -f "$rootfs/vmlinuz")" "$work/vmlinuz"
cp "$(readlink -f "$rootfs/initrd.img")" "$work/initrd.img"

# Every VM gets its own machine-id at first boot, and its host key from its seed, never from the image.
: >"$rootfs/etc/machine-id"
rm -f "$rootfs"/etc/ssh/ssh_host_*
printf 'HostKey /etc/ssh/ssh_host_ed25519_key\nPasswordAuthentication no\nPermitRootLogin prohibit-password\n' \
  >"$rootfs/etc/ssh/sshd_config.d/ddp-vm.conf"
# A minbase rootfs has no /etc/hosts; the seed adds the VM's own name (c10d rendezvous must resolve it).
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
echo debian12-vm >"$rootfs/etc/hostname"
printf '/dev/vda\t/\text4\terrors=remount-ro\t0\t1\n' >"$rootfs/etc/fstab"

chroot "$rootfs" systemctl enable systemd-networkd.service ssh.service >>"$log" 2>&1 \
  || fail "systemctl enable"
# The NFS roles start the services they need; a stock boot without them is faster and shows what the roles do.
# Timers, logind (no PAM session uses it here), the console login and pNFS block layout only slow the boot.
chroot "$rootfs" systemctl disable nfs-server.service rpcbind.service rpcbind.socket nfs-blkmap.service >>"$log" 2>&1 || true
chroot "$rootfs" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
  fstrim.timer getty@tty1.service modprobe@drm.service sys-kernel-debug.mount sys-kernel-tracing.mount \
  systemd-binfmt.service systemd-logind.service systemd-pstore.service dpkg-db-backup.timer >>"$log" 2>&1 || true
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin

# -d fills the filesystem from the directory (owners, modes, links kept) without mounting anything.
mke2fs -q -t ext4 -L ddp-root -d "$rootfs" "$work/rootfs.ext4" "$disk_size" >>"$log" 2>&1 || fail mke2fs
rm -rf "$rootfs"
rm -rf "$image_dir"
mv "$work" "$image_dir"
trap - EXIT
# Older recipes' images go once no VM set could still be using one as its base (~0.8 GB each).
if ! compgen -G "$cache/run/*/" >/dev/null; then
  for old in "$cache"/images/debian12-*/; do
    old=${old%/}
    [ "$old" = "$image_dir" ] || rm -rf "$old" "$cache/images/.lock-${old##*-}"
  done
fi
echo "built $image_dir in $((SECONDS - start)) s" >&2
echo "$image_dir"
