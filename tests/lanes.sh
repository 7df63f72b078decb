#!/usr/bin/env bash
# Runs lanes of work at the same time, each a shell command, and fails when any lane failed:
#   tests/lanes.sh NAME 'COMMAND' [NAME 'COMMAND' ...]
# Each line a lane prints is prefixed with [NAME], so the interleaved log still reads lane by lane
# (grep '^\[NAME\]'). A failing lane does not stop the others: their results are worth having.
set -uo pipefail
names=() pids=()
while [ $# -ge 2 ]; do
  name=$1 command=$2; shift 2
  ( set -o pipefail
    tests/stage.sh "$name" bash -c "$command" 2>&1 | sed -u "s/^/[$name] /" ) &
  names+=("$name") pids+=($!)
done
# Ctrl-C or a CI kill ends every lane, not only this script.
trap 'kill -- "${pids[@]}" 2>/dev/null; exit 130' INT TERM
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "lanes failed: ${failed[*]}" >&2
  exit 1
fi
