"""Two Slurm clusters, 22.05 on Debian 12 and 24.11 on Debian 13, two nodes each, as the role left them: the
daemons run with the rendered configuration, two users' jobs queue and run one after the other, scancel works
for the owner only, and a node whose slurmd is killed fails its job and comes back by itself.

Every check drives Slurm through its own commands (sbatch, squeue, scontrol, scancel) as a user would; the
nodes are reached with `docker exec` (testhosts.container)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import testinfra
import yaml
from testhosts import container

# The scenario's clusters (molecule.yml): name -> (controller, other node). The controller is the first host.
CLUSTERS = {
    "d12": ("slurm-d12-node0", "slurm-d12-node1"),
    "d13": ("slurm-d13-node0", "slurm-d13-node1"),
}
RELEASE = {"d12": "bookworm", "d13": "trixie"}
# The role's defaults hold the one place the versions are written.
VERSIONS = yaml.safe_load((Path(__file__).resolve().parents[3] / "defaults" / "main.yml").read_text())["slurm_versions"]
USERS = ("alice", "bob")
# The scenario's failure timings: a dead slurmd is noticed within about 2 x (SlurmdTimeout + MessageTimeout)
# here, and systemd restarts it after 25 s.
NODE_FAIL_WITHIN_S = 60
BACK_WITHIN_S = 90
END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "PREEMPTED"}


ROOT = Path(os.environ["DDP_REPO_ROOT"])
INVENTORY_DIR = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent


def node(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"docker://{container(name)}")


def as_user(user: str, command: str) -> str:
    return f"runuser -u {user} -- sh -c {shlex.quote(command)}"


def submit(controller: str, user: str, options: str, script: str) -> str:
    """sbatch as user, from their home; the job id."""
    command = f"cd && sbatch --parsable {options} --wrap={shlex.quote(script)}"
    return node(controller).check_output(as_user(user, command)).strip()


def job(controller: str, job_id: str) -> dict[str, str]:
    """scontrol's view of a job, as Key=Value pairs."""
    line = node(controller).check_output(f"scontrol show job -o {job_id}")
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def wait_for(controller: str, job_id: str, states: set[str], within_s: float) -> tuple[dict[str, str], float]:
    """Waits until the job is in one of states; its record and the seconds it took."""
    start = time.monotonic()
    record = job(controller, job_id)
    while record["JobState"] not in states:
        elapsed = time.monotonic() - start
        assert elapsed < within_s, f"job {job_id} on {controller}: {record['JobState']} after {elapsed:.0f} s"
        assert record["JobState"] not in END_STATES, f"job {job_id} ended {record['JobState']}, not {states}"
        time.sleep(0.5)
        record = job(controller, job_id)
    return record, time.monotonic() - start


def node_states(controller: str) -> dict[str, str]:
    out = node(controller).check_output("sinfo --noheader --Node --format='%N %T'")
    return dict(line.split() for line in out.splitlines())


def each_cluster(check):
    """Runs check(cluster) for both clusters at once (their jobs wait on Slurm, not on this machine)."""
    with ThreadPoolExecutor(len(CLUSTERS)) as pool:
        return dict(zip(CLUSTERS, pool.map(check, CLUSTERS), strict=True))


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_daemons_run_with_the_rendered_config_and_every_node_is_idle(cluster):
    controller, other = CLUSTERS[cluster]
    config = node(controller).check_output("scontrol show config")
    settings = dict(line.split(" = ", 1) for line in config.splitlines() if " = " in line)
    settings = {key.strip(): value.strip() for key, value in settings.items()}
    assert settings["ClusterName"] == cluster
    assert settings["SlurmctldHost[0]"].startswith(controller)
    assert (settings["SlurmctldPort"], settings["SlurmdPort"]) == ("6817", "6818")
    assert settings["SrunPortRange"] == "61000-61499"
    assert settings["ReturnToService"] == "2"
    assert settings["SlurmdTimeout"] == "6 sec"
    assert settings["JobRequeue"] == "0"
    assert settings["SLURM_VERSION"] == VERSIONS[RELEASE[cluster]].split("-")[0]
    assert node_states(controller) == {controller: "idle", other: "idle"}
    # One slurm.conf for the cluster (Slurm compares hashes), slurmctld on the controller only.
    digests = {
        name: node(name).check_output("sha256sum /etc/slurm/slurm.conf").split()[0] for name in (controller, other)
    }
    assert len(set(digests.values())) == 1, digests
    assert node(controller).service("slurmctld").is_running
    assert not node(other).service("slurmctld").is_running
    for name in (controller, other):
        assert node(name).service("slurmd").is_running and node(name).service("slurmd").is_enabled
        assert node(name).service("munge").is_running


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_each_node_is_described_by_its_facts_and_gpus(cluster):
    controller, other = CLUSTERS[cluster]
    for name in (controller, other):
        line = node(controller).check_output(f"scontrol show node -o {name}")
        fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
        assert fields["CPUTot"] == node(name).check_output("nproc --all")
        # No NVIDIA device nodes on a test host: no GPU in Slurm's view or in gres.conf.
        assert fields["Gres"] == "(null)"
    assert "NodeName=" not in node(controller).file("/etc/slurm/gres.conf").content_string


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_packages_are_pinned_and_held_at_the_releases_version(cluster):
    version = VERSIONS[RELEASE[cluster]]
    for name in CLUSTERS[cluster]:
        host = node(name)
        held = host.check_output("apt-mark showhold").split()
        assert {"slurmd", "slurm-client", "slurm-wlm-basic-plugins"} <= set(held)
        assert host.package("slurmd").version == version
        policy = host.check_output("apt-cache policy slurmd")
        assert f"{version} 1001" in " ".join(policy.split()), policy


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_process_tracking_is_what_each_nodes_check_found(cluster):
    controller, _ = CLUSTERS[cluster]
    record = json.loads(node(controller).file("/etc/slurm/ddp-process-tracking.json").content_string)
    for name in CLUSTERS[cluster]:
        # The checks follow the node itself: a test host shares its host's cgroup v1 hierarchy, and has no
        # CAP_SYS_NICE to bind another user's process to CPUs.
        filesystem = node(name).check_output("stat -fc %T /sys/fs/cgroup")
        nice = int(node(name).check_output("awk '/^CapEff/ {print $2}' /proc/self/status"), 16) >> 23 & 1
        checks = record["checks"][name]
        assert filesystem != "cgroup2fs", "the scenario's premise: test hosts on a cgroup v1 host"
        assert checks["cgroup"]["usable"] is False
        assert checks["cgroup"]["reason"].startswith(f"/sys/fs/cgroup is {filesystem}, not the unified cgroup v2")
        assert checks["affinity"]["usable"] is bool(nice), checks["affinity"]
    settings = node(controller).check_output("scontrol show config")
    assert (record["proctrack"], record["task"]) == ("proctrack/pgid", "task/none")
    assert "ProctrackType           = proctrack/pgid" in settings
    # 24.11 shows task/none, which is built in, as (null).
    assert re.search(r"^TaskPlugin\s+= (task/none|\(null\))$", settings, re.MULTILINE), settings
    assert not node(controller).file("/etc/slurm/cgroup.conf").exists


def test_each_cluster_has_one_munge_key_of_its_own():
    keys = {}
    for cluster, names in CLUSTERS.items():
        for name in names:
            key = node(name).file("/etc/munge/munge.key")
            assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400), name
            digest = node(name).check_output("sha256sum /etc/munge/munge.key").split()[0]
            keys.setdefault(cluster, set()).add(digest)
    assert all(len(digests) == 1 for digests in keys.values()), keys
    assert keys["d12"] != keys["d13"]
    # A credential made on one node decodes on its peer, and not in the other cluster.
    credential = node("slurm-d12-node1").check_output("munge -n")
    assert node("slurm-d12-node0").run(f"echo {shlex.quote(credential)} | unmunge").rc == 0
    foreign = node("slurm-d13-node0").run(f"echo {shlex.quote(credential)} | unmunge")
    assert foreign.rc != 0 and "Invalid credential" in foreign.stderr


def _two_users(cluster: str) -> dict[str, object]:
    controller, other = CLUSTERS[cluster]
    # One task per node; each writes into its user's own directory on that node, then names its host.
    script = (
        "srun --ntasks-per-node=1 sh -c '"
        "d=$HOME/runs/$SLURM_JOB_ID; mkdir -p $d; date +%s.%N > $d/$(hostname).start; sleep 2; "
        "id -un > $d/$(hostname).user; date +%s.%N > $d/$(hostname).end; hostname'"
    )
    options = "--nodes=2 --ntasks-per-node=1 --exclusive --output=job-%j.out"
    jobs = {user: submit(controller, user, options, script) for user in USERS}
    # Both are in the queue at once: the whole cluster is taken, so one waits for the other.
    queue = node(controller).check_output("squeue --noheader --format='%i %u %T'")
    finished = {user: wait_for(controller, job_id, END_STATES, 120)[0] for user, job_id in jobs.items()}
    spans = {}
    for user, job_id in jobs.items():
        starts, ends = [], []
        for name in (controller, other):
            host = node(name)
            run_dir = f"/home/{user}/runs/{job_id}"
            assert host.file(f"{run_dir}/{name}.user").content_string.strip() == user
            assert host.file(f"{run_dir}/{name}.user").user == user
            starts.append(float(host.file(f"{run_dir}/{name}.start").content_string))
            ends.append(float(host.file(f"{run_dir}/{name}.end").content_string))
        spans[user] = (min(starts), max(ends))
    # The output lands on the job's first node, in the submitter's home, with both nodes' names.
    outputs = {user: node(controller).file(f"/home/{user}/job-{job_id}.out") for user, job_id in jobs.items()}
    return {"jobs": jobs, "queue": queue, "finished": finished, "spans": spans, "outputs": outputs}


def test_two_users_jobs_both_complete_one_after_the_other_each_with_its_own_output():
    results = each_cluster(_two_users)
    for cluster, result in results.items():
        controller, other = CLUSTERS[cluster]
        jobs = result["jobs"]
        # Both were in the queue at once, and the whole cluster being taken, one of them waited.
        queued = dict(line.split(" ", 1) for line in result["queue"].splitlines())
        assert {queued[jobs[user]].split()[0] for user in USERS} == set(USERS), result["queue"]
        assert "PENDING" in {queued[jobs[user]].split()[1] for user in USERS}, result["queue"]
        for user in USERS:
            record = result["finished"][user]
            assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), (cluster, user, record)
            output = result["outputs"][user]
            assert output.user == user
            assert sorted(output.content_string.split()) == sorted([controller, other])
        (a_start, a_end), (b_start, b_end) = result["spans"]["alice"], result["spans"]["bob"]
        assert a_end <= b_start or b_end <= a_start, f"{cluster}: the two jobs overlapped: {result['spans']}"


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_scancel_cancels_a_job_but_not_another_users(cluster):
    controller, _ = CLUSTERS[cluster]
    job_id = submit(controller, "alice", "--nodes=1 --output=/dev/null", "sleep 300")
    wait_for(controller, job_id, {"RUNNING"}, 30)
    refused = node(controller).run(as_user("bob", f"scancel {job_id}"))
    assert refused.rc != 0
    assert "permission denied" in refused.stderr.lower() or "access denied" in refused.stderr.lower(), refused.stderr
    time.sleep(1)
    assert job(controller, job_id)["JobState"] == "RUNNING"
    node(controller).check_output(as_user("alice", f"scancel {job_id}"))
    record, _ = wait_for(controller, job_id, {"CANCELLED"}, 30)
    assert record["JobState"] == "CANCELLED"


def _kill_slurmd(cluster: str) -> dict[str, object]:
    controller, other = CLUSTERS[cluster]
    job_id = submit(controller, "alice", "--nodes=2 --ntasks-per-node=1 --output=/dev/null", "srun sleep 300")
    wait_for(controller, job_id, {"RUNNING"}, 30)
    restarts = int(node(other).check_output("systemctl show -p NRestarts --value slurmd"))
    node(other).check_output("pkill -KILL -x slurmd")
    failed, failed_after = wait_for(controller, job_id, END_STATES, NODE_FAIL_WITHIN_S)
    start = time.monotonic()
    while node_states(controller).get(other) != "idle":
        assert time.monotonic() - start < BACK_WITHIN_S, f"{other} not back: {node_states(controller)}"
        time.sleep(1)
    back_after = failed_after + time.monotonic() - start
    # The next job takes both nodes again, the restarted one included.
    after = node(controller).run(
        as_user(
            "alice",
            "cd && sbatch --wait --parsable --nodes=2 --ntasks-per-node=1 --output=after-%j.out --wrap='srun hostname'",
        )
    )
    next_job = job(controller, after.stdout.strip()) if after.rc == 0 else {}
    return {
        "failed": failed,
        "failed_after": failed_after,
        "back_after": back_after,
        "restarts": int(node(other).check_output("systemctl show -p NRestarts --value slurmd")) - restarts,
        "after": after,
        "next_job": next_job,
    }


def test_a_killed_slurmd_fails_its_job_and_the_node_serves_the_next_one(capsys):
    results = each_cluster(_kill_slurmd)
    for cluster, result in results.items():
        with capsys.disabled():
            print(
                f"\n{cluster}: job {result['failed']['JobState']} {result['failed_after']:.0f} s after slurmd was"
                f" killed, node idle again after {result['back_after']:.0f} s"
            )
        assert result["failed"]["JobState"] in {"NODE_FAIL", "FAILED"}, result["failed"]
        assert result["restarts"] == 1, "systemd did not restart slurmd"
        assert result["after"].rc == 0, result["after"].stderr
        assert (result["next_job"]["JobState"], result["next_job"]["ExitCode"]) == ("COMPLETED", "0:0")


def run_stage(extravars: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """The scheduler stage on the scenario's hosts, as an operator runs it, with extra variables."""
    command = ["ansible-playbook", "-i", str(INVENTORY_DIR), str(ROOT / "ansible/playbooks/scheduler.yml")]
    env = os.environ | {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        "ANSIBLE_NOCOLOR": "1",
    }
    command += ["-e", json.dumps(extravars)]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)


# Each refused before any host changes, with a message naming the variable (and the host).
BAD_INPUTS = {
    "scheduler": ({"scheduler": "pbs"}, "scheduler='pbs' on slurm-d12-node0 (the role's slurm_scheduler): must be"),
    "node count": ({"slurm_node_count": 3}, "slurm_node_count=3 on slurm-d12-node0: the inventory group slurm_d12"),
    "controller": ({"slurm_controller_host": "node9"}, "slurm_controller_host='node9' on slurm-d12-node0: no such"),
    "srun range": (
        {"slurm_srun_port_range_start": 6800, "slurm_srun_port_range_end": 6900},
        "slurm_slurmctld_port and slurm_slurmd_port on slurm-d12-node0 inside slurm_srun_port_range_start-end",
    ),
    # Needs the nodes' facts: Debian 12 and 13 hosts in one Slurm cluster would run 22.05 beside 24.11.
    "two releases": (
        {"slurm_nodes_group": "cluster", "slurm_node_count": 0},
        "The hosts of one Slurm cluster must run one Slurm version, but slurm-d12-node0 runs Debian bookworm",
    ),
}


def test_bad_inputs_are_refused_before_any_host_changes():
    before = {name: node(name).check_output("sha256sum /etc/slurm/slurm.conf") for name in CLUSTERS["d12"]}
    with ThreadPoolExecutor(3) as pool:
        results = dict(zip(BAD_INPUTS, pool.map(run_stage, [case[0] for case in BAD_INPUTS.values()]), strict=True))
    for case, result in results.items():
        output = " ".join((result.stdout + result.stderr).split())
        assert result.returncode != 0, f"{case}: not refused"
        assert BAD_INPUTS[case][1] in output, f"{case}: {output[-2000:]}"
        changed = re.findall(r"changed=(\d+)", result.stdout)
        assert changed and set(changed) == {"0"}, f"{case}: {changed}"
    assert {name: node(name).check_output("sha256sum /etc/slurm/slurm.conf") for name in CLUSTERS["d12"]} == before
