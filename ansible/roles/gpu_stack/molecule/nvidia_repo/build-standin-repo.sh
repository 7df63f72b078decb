#!/usr/bin/env bash
# Builds a stand-in for one of NVIDIA's CUDA repositories: build-standin-repo.sh DIR NAME=VERSION...
# DIR gets empty packages of those names and versions, Packages, Release, an InRelease signed by a key made here,
# and that key as 3bf863cc.pub, the way NVIDIA lays out .../<distro>/<arch>/.
set -euo pipefail
dir=$1; shift
work=$(mktemp -d)
export GNUPGHOME=$work/gnupg
mkdir -p -m 700 "$GNUPGHOME" "$dir"
for spec in "$@"; do
  name=${spec%%=*} version=${spec#*=}
  mkdir -p "$work/$name-$version/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: gpu_stack tests <tests@example.invalid>\nDescription: stand-in for %s\n' \
    "$name" "$version" "$name" > "$work/$name-$version/DEBIAN/control"
  dpkg-deb --build --root-owner-group "$work/$name-$version" "$dir/${name}_${version}_amd64.deb" > /dev/null
done
gpg --batch --passphrase '' --quick-gen-key 'gpu_stack stand-in repository' rsa2048 sign never 2> /dev/null
gpg --batch --armor --export > "$dir/3bf863cc.pub"
cd "$dir"
apt-ftparchive packages . > Packages
apt-ftparchive release . > Release
gpg --batch --clearsign --output InRelease Release
rm -rf "$work"
