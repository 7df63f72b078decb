#!/usr/bin/env bash
# What the unit tests use on the controller, from Debian: headless Chromium (they open a run's report.html as a
# person would), iperf3 (make doctor measures inventory/local's loopback pair with it) and sudo (Ansible's become,
# for a job run as a second local account).
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v iperf3 >/dev/null || missing+=(iperf3)
command -v sudo >/dev/null || missing+=(sudo)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
