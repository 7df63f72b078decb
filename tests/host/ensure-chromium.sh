#!/usr/bin/env bash
# Headless Chromium from Debian, for the tests that open a run's report.html as a person would.
set -euo pipefail
command -v chromium >/dev/null && exit 0
echo "installing chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium >/dev/null
