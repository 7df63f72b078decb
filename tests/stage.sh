#!/usr/bin/env bash
# Runs one named stage and prints its wall time, also when it fails: tests/stage.sh NAME COMMAND...
set -uo pipefail
name=$1; shift
start=$(date +%s)
echo "=== stage $name: start"
"$@"
rc=$?
echo "=== stage $name: $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
