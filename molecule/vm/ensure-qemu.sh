#!/usr/bin/env bash
# Makes sure the VM tier's host tools are present: QEMU (system emulator and qemu-img), debootstrap for the
# image recipe, e2fsprogs for `mke2fs -d`, and ssh-keygen for the per-test keys. CI machines start without
# QEMU, so this installs Debian's packages when something is missing.
set -euo pipefail

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
