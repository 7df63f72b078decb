#!/usr/bin/env bash
# Runs every scenario of one role in this test run (molecule/testrun.sh): molecule/run-role.sh ROLE
# (`make molecule ROLE=x` calls it, and cleans up after it).
# Each scenario gets its own molecule state directory inside the run's directory: molecule's default is one
# per role and scenario on the machine, which two runs of the same role would share.
set -euo pipefail
role=${1:?usage: molecule/run-role.sh ROLE}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo/ansible/roles/$role"
for config in molecule/*/molecule.yml; do
  scenario=$(basename "$(dirname "$config")")
  # Container scenarios need the run's docker network; VM scenarios (molecule/vm/create.yml) bring their own.
  if [ -z "${DDP_TEST_NET:-}" ] && ! grep -q molecule/vm/create.yml "$config"; then
    DDP_TEST_NET=$("$repo/molecule/testrun.sh" network)
    export DDP_TEST_NET
  fi
  MOLECULE_EPHEMERAL_DIRECTORY=/tmp/ddp-molecule-$DDP_TEST_RUN/$role/$scenario \
    molecule -c "$repo/molecule/base.yml" test --scenario-name "$scenario"
done
