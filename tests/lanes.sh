#!/usr/bin/env bash
# Runs lanes of work at the same time, each a shell command, and fails when any lane failed:
#   tests/lanes.sh NAME 'COMMAND' [NAME 'COMMAND' ...]
# Each line a lane prints is prefixed with [NAME], so the interleaved log still reads lane by lane
# (grep '^\[NAME\]'). A failing lane does not stop the others: their results are worth having.
# A failed run ends with what failed (failed tests, failed tasks, failed stages), so that the last screen of a
# long CI log names the cause.
set -uo pipefail
logs=$(mktemp -d)
# The lanes write to a pipe, which has no width: without one, molecule wraps every line at 80 columns, a failed
# test's name among them.
export COLUMNS=${COLUMNS:-200}
names=() pids=()
while [ $# -ge 2 ]; do
  name=$1 command=$2; shift 2
  ( set -o pipefail
    tests/stage.sh "$name" bash -c "$command" 2>&1 | sed -u "s/^/[$name] /" | tee "$logs/$name" ) &
  names+=("$name") pids+=($!)
done
# Ctrl-C or a CI kill ends every lane, not only this script.
trap 'kill -- "${pids[@]}" 2>/dev/null; exit 130' INT TERM
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "lanes failed: ${failed[*]}; what failed:" >&2
  for name in "${failed[@]}"; do
    # Colour codes out; pytest's summary lines, Ansible's failed tasks and the failed stages, each cut to one
    # screen line, the last 12 of them.
    sed 's/\x1b\[[0-9;]*m//g' "$logs/$name" |
      grep -aE '^\[[^]]*\] [ │]*((FAILED|ERROR) |fatal: |=== stage .*exit [1-9])' | grep -av 'FAILED - RETRYING' | cut -c1-240 | tail -n 12 >&2
  done
fi
rm -rf "$logs"
[ ${#failed[@]} -eq 0 ]
