#!/usr/bin/env bash
# Removes test hosts left by a failed or interrupted run: those of one role (molecule/cleanup.sh ROLE),
# or all of them and the test network (no argument).
set -uo pipefail
label=ddp.testhost
filter="label=$label"
[ $# -gt 0 ] && filter="label=$label=$1"
ids=$(docker ps -aq --filter "$filter" 2>/dev/null)
if [ -n "$ids" ]; then
  # shellcheck disable=SC2086  # one id per word
  docker rm -f --volumes $ids >/dev/null && echo "removed $(echo $ids | wc -w) test host(s)"
fi
# A role's VM sets (the VM tier names them <role>-<scenario>).
if [ $# -gt 0 ] && [ -x "$(dirname "$0")/vm/vmctl.sh" ]; then
  "$(dirname "$0")/vm/vmctl.sh" down-all "$1-" >/dev/null 2>&1 || true
fi
if [ $# -eq 0 ]; then
  nets=$(docker network ls -q --filter "label=$label" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$nets" ] && docker network rm $nets >/dev/null && echo "removed the test network"
fi
exit 0
