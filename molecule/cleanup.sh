#!/usr/bin/env bash
# Removes what a failed or interrupted test run left behind (molecule/testrun.sh says what a run is):
#   molecule/cleanup.sh ROLE    this run's (DDP_TEST_RUN) test hosts and VM sets of one role
#   molecule/cleanup.sh         everything of this run: its test hosts, VM sets, network and shared directories
#   molecule/cleanup.sh --all   every run's test hosts, networks and shared directories (make clean-test-hosts)
set -uo pipefail
here=$(dirname "$0")
label=ddp.testhost

remove_containers() {  # docker ps filters, all of which must match
  local ids
  ids=$(docker ps -aq "${@/#/--filter=}" 2>/dev/null)
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086  # one id per word
    docker rm -f --volumes $ids >/dev/null && echo "removed $(echo $ids | wc -w) test host(s)"
  fi
}

remove_networks() {
  local ids
  ids=$(docker network ls -q "${@/#/--filter=}" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$ids" ] && docker network rm $ids >/dev/null && echo "removed $(echo $ids | wc -w) test network(s)"
}

if [ "${1:-}" = --all ]; then
  remove_containers "label=$label"
  remove_networks "label=$label"
  rm -rf /tmp/ddp-molecule-*
  exit 0
fi

run=${DDP_TEST_RUN:-}
[[ $run =~ ^[a-z0-9]{1,12}$ ]] || { echo "cleanup: DDP_TEST_RUN='$run' names no run (or use --all)" >&2; exit 2; }
if [ $# -gt 0 ]; then
  remove_containers "label=$label=$1" "label=ddp.testrun=$run"
  "$here/vm/vmctl.sh" down-all "$run-$1-" >/dev/null 2>&1 || true
else
  remove_containers "label=ddp.testrun=$run"
  "$here/vm/vmctl.sh" down-all "$run-" >/dev/null 2>&1 || true
  remove_networks "label=ddp.testrun=$run"
  rm -rf "/tmp/ddp-molecule-$run"
fi
exit 0
