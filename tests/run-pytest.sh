#!/usr/bin/env bash
# pytest, with "no tests collected" (exit 5) reported as the failure it is rather than passing silently.
set -uo pipefail
pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests from: $*  (exit 5 counts as a failure)" >&2
fi
exit "$rc"
