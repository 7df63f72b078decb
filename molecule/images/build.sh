#!/usr/bin/env bash
# Builds the systemd test-host base images locally (no registry is reachable): debootstrap, then docker import.
# An image is rebuilt only when this recipe changes: its tag carries the recipe's hash.
#   usage: molecule/images/build.sh [debian12|debian13 ...]   (default: both)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
recipe_hash=$(sha256sum "$here/build.sh" | cut -c1-12)
packages=systemd,systemd-sysv,dbus,openssh-server,openssh-client,python3,python3-apt,sudo,iproute2,iputils-ping,netcat-openbsd,procps,ca-certificates,gnupg,curl,less

suite_of() {
  case "$1" in
    debian12) echo bookworm ;;
    debian13) echo trixie ;;
    *) echo "unknown image '$1' (expected debian12 or debian13)" >&2; return 2 ;;
  esac
}

# The property above, read back from the image itself.
check_fresh_apt_state() {
  docker run --rm --network none --entrypoint /bin/sh "$1" -c '
    set -e
    lists=$(find /var/lib/apt/lists -mindepth 1 -name "*_Packages*" | head -n 3)
    [ -z "$lists" ] || { echo "image has package lists: $lists"; exit 1; }
    [ ! -e /var/lib/apt/periodic/update-success-stamp ] || { echo "image has an apt update stamp"; exit 1; }
    [ "$(stat -c %Y /var/lib/apt/lists)" = 0 ] || { echo "image lists directory is not stamped never-refreshed"; exit 1; }
    [ ! -e /var/cache/apt/pkgcache.bin ] || { echo "image has an apt package cache"; exit 1; }' \
    || { echo "$1: a test host must start without apt package lists" >&2; return 1; }
}

build_one() {
  local name=$1 suite tag rootfs
  suite=$(suite_of "$name")
  tag="ddp-testhost:$name-$recipe_hash"
  if docker image inspect "$tag" >/dev/null 2>&1; then
    docker tag "$tag" "ddp-testhost:$name"
    echo "image ddp-testhost:$name is current ($tag)"
    return
  fi
  rootfs=$(mktemp -d "/tmp/ddp-rootfs-$name.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the path is fixed for this build
  trap "rm -rf '$rootfs'" RETURN
  echo "building $tag from $suite (debootstrap, about a minute)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log"; return 1; }
  rm -f "$rootfs.log"
  # Every container must get its own machine-id and host keys at first boot.
  : >"$rootfs/etc/machine-id"
  rm -f "$rootfs"/etc/ssh/ssh_host_*
  chroot "$rootfs" systemctl enable ssh.service >/dev/null 2>&1 || true
  # sshd regenerates missing host keys at start (Debian's ssh.service does not), so do it in a unit.
  cat >"$rootfs/etc/systemd/system/ssh-hostkeys.service" <<'UNIT'
[Unit]
Description=Generate SSH host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
  chroot "$rootfs" systemctl enable ssh-hostkeys.service >/dev/null 2>&1
  # Units that cannot work in a container only slow the boot down.
  chroot "$rootfs" systemctl mask systemd-remount-fs.service getty.target console-getty.service \
    systemd-firstboot.service >/dev/null 2>&1
  # A test host starts as a new machine does: no package lists, and lists that say "never refreshed" (apt's
  # cache_valid_time reads this directory's mtime, which emptying it would set to now). A scenario that installs
  # a package without refreshing the lists then fails on every machine, not only on one that built the image
  # less than cache_valid_time ago.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/lib/apt/periodic
  touch -d @0 "$rootfs"/var/lib/apt/lists
  tar -C "$rootfs" -c . | docker import \
    --change 'CMD ["/lib/systemd/systemd"]' \
    - "$tag" >/dev/null
  check_fresh_apt_state "$tag" || { docker image rm "$tag" >/dev/null; return 1; }
  docker tag "$tag" "ddp-testhost:$name"
  echo "built $tag"
}

command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
for name in "${@:-debian12 debian13}"; do
  # shellcheck disable=SC2086  # the default is a word list on purpose
  for one in $name; do build_one "$one"; done
done
