#!/usr/bin/env bash
# Removes every test host and test network left by any scenario (after a failed or interrupted run).
set -uo pipefail
label=ddp.testhost
ids=$(docker ps -aq --filter "label=$label" 2>/dev/null)
[ -n "$ids" ] && docker rm -f $ids >/dev/null && echo "removed test hosts: $(echo $ids | wc -w)"
nets=$(docker network ls -q --filter "label=$label" 2>/dev/null)
[ -n "$nets" ] && docker network rm $nets >/dev/null && echo "removed test networks"
exit 0
