#!/usr/bin/env bash
# Makes sure a Docker engine answers on this machine: installs Debian's docker.io and starts dockerd when
# absent (CI machines start without one), and installs debootstrap for the test-host images.
set -euo pipefail

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then exit 0; fi

if [ "$(ps -p 1 -o comm=)" = systemd ]; then
  systemctl start docker
else
  # No init system here: run the daemon in the background, logging beside its pid file.
  nohup dockerd >/var/log/ddp-dockerd.log 2>&1 &
fi
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && { echo "docker engine is up"; exit 0; }
  sleep 1
done
echo "docker engine did not start; see /var/log/ddp-dockerd.log" >&2
exit 1
