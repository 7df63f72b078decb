#!/usr/bin/env bash
# The test network of one test run: `molecule/testrun.sh network` makes it on first use and prints its /24
# without the last byte (for DDP_TEST_NET, which scenarios build their addresses from).
#
# A run is one make command (the Makefile gives it DDP_TEST_RUN, and sub-makes inherit it). Its test hosts,
# network, shared directories and VM sets all carry the id, so two runs (two roles, or one role twice) never
# share a name, an address or a directory, and molecule/cleanup.sh removes only its own run's.
#
# The subnet is the first of 172.30.213-254 (then 200-212) that docker accepts: docker refuses a subnet that
# overlaps another network's, which makes the create itself the allocation, safe when two runs start at once.
set -euo pipefail

run=${DDP_TEST_RUN:?DDP_TEST_RUN is not set: start test runs with make (make molecule ROLE=x, make test)}
[[ $run =~ ^[a-z0-9]{1,12}$ ]] || { echo "testrun: DDP_TEST_RUN='$run': use 1-12 lowercase letters and digits" >&2; exit 2; }
[ "${1:-}" = network ] || { echo "usage: molecule/testrun.sh network" >&2; exit 2; }
name=ddp-testnet-$run

existing_prefix() {
  local subnet
  subnet=$(docker network inspect --format '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$name" 2>/dev/null) || return 1
  echo "${subnet%.0/24}"
}

existing_prefix && exit 0
for third in $(seq 213 254) $(seq 200 212); do
  if error=$(docker network create --subnet "172.30.$third.0/24" --label ddp.testhost=network \
      --label "ddp.testrun=$run" "$name" 2>&1 >/dev/null); then
    echo "172.30.$third"
    exit 0
  fi
  # Another command of this run made it meanwhile: use that one.
  existing_prefix && exit 0
  [[ $error == *overlap* ]] || { echo "testrun: creating $name: $error" >&2; exit 1; }
done
echo "testrun: every /24 of 172.30.200.0-172.30.254.255 is taken; make clean-test-hosts removes what old runs left" >&2
exit 1
