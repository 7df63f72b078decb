#!/usr/bin/env bash
# Builds a stand-in for Docker's apt repository: build-standin-repo.sh DIR VERSION...
# DIR/linux/debian gets what download.docker.com/linux/debian has for this release and architecture: the armoured
# key as gpg, dists/<codename>/InRelease (signed by a key made here) over Release and stable/binary-<arch>/Packages,
# and pool/stable/<arch>/ with docker-ce and docker-ce-cli at each VERSION (5:VERSION-1~debian.<n>~<codename>, as
# Docker numbers them), containerd.io and docker-buildx-plugin.
# docker-ce is Debian's docker.io repackaged (it conflicts with docker-ce, so it cannot simply be depended on):
# its daemon, scripts and systemd units, its real dependencies (containerd, runc, iptables, tini from Debian),
# its client moved to docker-ce-cli as Docker splits them. Every version carries the same payload.
set -euo pipefail
dir=$1/linux/debian; shift
arch=$(dpkg --print-architecture)
# shellcheck disable=SC1091  # the node's own
. /etc/os-release
codename=$VERSION_CODENAME
suffix="-1~debian.$VERSION_ID~$codename"
pool=pool/stable/$arch
work=$(mktemp -d)
export GNUPGHOME=$work/gnupg
mkdir -p -m 700 "$GNUPGHOME"
mkdir -p "$dir/$pool" "$dir/dists/$codename/stable/binary-$arch"
cd "$work"

apt-get download -q docker.io > /dev/null
dpkg-deb -R docker.io_*.deb engine
field() { dpkg-deb -f docker.io_*.deb "$1"; }
mkdir -p cli/DEBIAN cli/usr/bin cli/usr/share
mv engine/usr/bin/docker cli/usr/bin/
mv engine/usr/share/bash-completion engine/usr/share/fish engine/usr/share/zsh cli/usr/share/
# libnetwork's test tools and Debian's lintian notes are not part of docker-ce.
rm -rf engine/usr/bin/dnet engine/usr/sbin/ovrouter engine/usr/share/lintian
# Docker's postinst restarts the engine on an upgrade (dh_installsystemd's default); Debian's only starts it, which
# would leave the old daemon running from a deleted binary.
sed -i "s|deb-systemd-invoke start 'docker.service'|deb-systemd-invoke \"\$(if [ -n \"\$2\" ]; then echo restart; else echo start; fi)\" 'docker.service'|" \
  engine/DEBIAN/postinst
grep -q 'echo restart' engine/DEBIAN/postinst
for root in engine cli; do
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
done

# build ROOT NAME VERSION [FIELD: VALUE]...: a package from ROOT's files with a control file written here.
build() {
  local root=$1 name=$2 version=$3; shift 3
  mkdir -p "$root/DEBIAN"
  {
    printf 'Package: %s\nVersion: %s\nArchitecture: %s\n' "$name" "$version" "$arch"
    printf 'Maintainer: docker role tests <tests@example.invalid>\nSection: admin\nPriority: optional\n'
    [ $# -eq 0 ] || printf '%s\n' "$@"
    printf 'Description: stand-in for Docker'"'"'s %s (docker role tests)\n' "$name"
  } > "$root/DEBIAN/control"
  dpkg-deb --build --root-owner-group -Zgzip -z1 "$root" "$dir/$pool/${name}_${version#*:}_$arch.deb" > /dev/null
}

for version in "$@"; do
  build engine docker-ce "5:$version$suffix" \
    "Pre-Depends: $(field Pre-Depends)" \
    "Depends: containerd.io, docker-ce-cli, $(field Depends)" \
    "Recommends: apparmor, ca-certificates, docker-ce-rootless-extras, pigz, procps, xz-utils" \
    "Conflicts: docker.io" "Replaces: docker.io"
  build cli docker-ce-cli "5:$version$suffix" "Depends: $(field Depends | grep -o 'libc6[^,]*')" \
    "Conflicts: docker.io"
done
# Debian's containerd and runc are what runs the containers.
build "$work/containerd.io" containerd.io 1.7.19-1 "Depends: containerd, runc"
build "$work/buildx" docker-buildx-plugin "0.16.1$suffix"

cd "$dir"
apt-ftparchive packages "$pool" > "dists/$codename/stable/binary-$arch/Packages"
apt-ftparchive -o APT::FTPArchive::Release::Origin=Docker -o APT::FTPArchive::Release::Label=Docker \
  -o APT::FTPArchive::Release::Suite="$codename" -o APT::FTPArchive::Release::Codename="$codename" \
  -o APT::FTPArchive::Release::Architectures="$arch" -o APT::FTPArchive::Release::Components=stable \
  release "dists/$codename" > "$work/Release"
mv "$work/Release" "dists/$codename/Release"
gpg --batch --passphrase '' --quick-gen-key 'docker role stand-in repository' ed25519 sign never 2> /dev/null
gpg --batch --clearsign --output "dists/$codename/InRelease" "dists/$codename/Release"
gpg --batch --armor --export > gpg
gpgconf --kill gpg-agent
rm -rf "$work"
