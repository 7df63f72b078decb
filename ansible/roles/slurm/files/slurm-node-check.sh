#!/bin/sh
# What Slurm's process tracking can use on this node, found by trying it. The role runs this on every slurmd
# node (ansible.builtin.script) and reads one JSON line:
#   {"cgroup": {"usable": true|false, "reason": "..."}, "affinity": {"usable": true|false, "reason": "..."}}
# It reads the node, starts one sleep and one transient unit, and leaves nothing behind.
#   slurm-node-check.sh          both checks
#   slurm-node-check.sh pgid     the affinity check only (slurm_process_tracking: pgid)
#
# cgroup: what Slurm's cgroup/v2 plugin needs (22.05 and 24.11), in the order it would fail:
#   1. the unified cgroup v2 hierarchy at /sys/fs/cgroup (cgroup v1, or a container that shares its host's v1
#      hierarchy, is not handed to Slurm: every node on one host would share one /slurm tree);
#   2. the D-Bus system bus, over which slurmd asks systemd for its slurmstepd scope;
#   3. a delegated cgroup (what systemd gives slurmd.service, Delegate=yes) in which a child can be made, a
#      process moved into it, and cpuset and memory enabled for the children, as slurmstepd does for every job
#      and step. Done for real, in a transient unit with Delegate=yes.
# affinity: task/affinity has slurmstepd (root) bind the job's tasks, processes of another user, to CPUs, which
#   needs CAP_SYS_NICE: tried on a sleep of the nobody user.
set -u

json() {
  # $1: true or false; $2: the reason (double quotes and backslashes are dropped).
  printf '{"usable": %s, "reason": "%s"}' "$1" "$(printf '%s' "$2" | tr -d '"\\' | tr '\n' ' ' | cut -c1-300)"
}

check_cgroup() {
  fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null || echo missing)
  if [ "$fs" != cgroup2fs ]; then
    json false "/sys/fs/cgroup is $fs, not the unified cgroup v2 hierarchy (cgroup v1, or a container sharing its host's)"
    return
  fi
  if [ ! -S /run/dbus/system_bus_socket ]; then
    json false "no D-Bus system bus (/run/dbus/system_bus_socket): slurmd asks systemd over it for its scope"
    return
  fi
  # Inside the delegated unit: its own cgroup, a leaf for this shell (0 is the writer itself; systemd-run would
  # turn a $$ into $), then cpuset and memory for the children.
  inner='
cg=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup)
mkdir "$cg/probe-leaf" 2>/dev/null && echo 0 > "$cg/probe-leaf/cgroup.procs" 2>/dev/null ||
  { echo "cannot make a child cgroup of the delegated $cg and move a process into it"; exit 1; }
for controller in cpuset memory; do
  grep -qw "$controller" "$cg/cgroup.controllers" ||
    { echo "the $controller controller is not available to a delegated cgroup"; exit 1; }
done
echo "+cpuset +memory" > "$cg/cgroup.subtree_control" 2>/dev/null ||
  { echo "cannot enable cpuset and memory for the children of a delegated cgroup"; exit 1; }
mkdir "$cg/probe-job" 2>/dev/null && grep -qw memory "$cg/probe-job/cgroup.controllers" ||
  { echo "a job cgroup below a delegated cgroup gets no memory controller"; exit 1; }
echo ok
'
  out=$(timeout 30 systemd-run --quiet --wait --pipe --collect --unit="ddp-slurm-check-$$" -p Delegate=yes \
    /bin/sh -c "$inner" 2>&1)
  if [ "$out" = ok ]; then
    json true "cgroup v2 with a D-Bus system bus; a delegated cgroup enables cpuset and memory for its children"
  else
    json false "${out:-systemd-run gave no answer}"
  fi
}

check_affinity() {
  mask=$(taskset -p $$ 2>/dev/null | awk '{print $NF}')
  setpriv --reuid=65534 --regid=65534 --clear-groups sleep 30 &
  sleeper=$!
  # Until the sleep runs as nobody: before that it is still this shell's root child, which proves nothing.
  tries=0
  while [ "$(stat -c %u "/proc/$sleeper" 2>/dev/null)" != 65534 ] && [ "$tries" -lt 50 ]; do
    sleep 0.1
    tries=$((tries + 1))
  done
  if out=$(taskset -p "${mask:-1}" "$sleeper" 2>&1 >/dev/null); then
    json true "root can bind another user's process to CPUs"
  else
    json false "root cannot bind another user's process to CPUs (${out##*: }; no CAP_SYS_NICE)"
  fi
  kill "$sleeper" 2>/dev/null
  wait "$sleeper" 2>/dev/null
}

if [ "${1:-}" = pgid ]; then
  cgroup=$(json false "not checked (slurm_process_tracking: pgid)")
else
  cgroup=$(check_cgroup)
fi
printf '{"cgroup": %s, "affinity": %s}\n' "$cgroup" "$(check_affinity)"
