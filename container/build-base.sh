#!/usr/bin/env bash
# Builds the local Debian base of the CPU training image (no registry needed): debootstrap, then docker import.
# The tag carries this recipe's hash, so the image is rebuilt only when the recipe changes; the plain tag
# (ddp-base:debian12) always points at the current one.
#   usage: container/build-base.sh [debian12|debian13]   (default: debian12, whose Python 3.11 the cp311 wheels fit)
# Needs root, debootstrap and a Debian mirror (DEBIAN_MIRROR, default deb.debian.org; an internal mirror works
# for an air-gapped site).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
name=${1:-debian12}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
recipe_hash=$(sha256sum "$here/build-base.sh" | cut -c1-12)
# python3-venv brings ensurepip (the venv's pip); the rest is what torch's wheel and TLS need at run time.
packages=python3,python3-venv,ca-certificates,libgomp1,procps

case "$name" in
  debian12) suite=bookworm ;;
  debian13) suite=trixie ;;
  *) echo "unknown base '$name' (expected debian12 or debian13)" >&2; exit 2 ;;
esac
tag="ddp-base:$name-$recipe_hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
  docker tag "$tag" "ddp-base:$name"
  echo "image ddp-base:$name is current ($tag)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }

rootfs=$(mktemp -d "/tmp/ddp-base-$name.XXXXXX")
trap 'rm -rf "$rootfs" "$rootfs.log"' EXIT
echo "building $tag from $suite (debootstrap, about a minute)"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -20 "$rootfs.log"; exit 1; }
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
: >"$rootfs/etc/machine-id"
# An imported image has no environment: give it the PATH and locale a Debian image has.
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$tag" >/dev/null
docker tag "$tag" "ddp-base:$name"
echo "built $tag"
