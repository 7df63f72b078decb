"""`ddp train` (what `make train` runs) through Slurm on the Debian 12 cluster, with scheduler: slurm: each
user submits as themselves (cluster_user), a second run waits in Slurm's queue and says where, `ddp stop`
cancels and is refused for another user's run, a run directory off shared storage is refused before any job is
submitted, and a node that Slurm loses fails the run naming it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from testhosts import container
from train_run import ARTIFACTS, cli, node_exec, start_cli_training

CONTROLLER, OTHER = "slurm-d12-node0", "slurm-d12-node1"
NODES = (CONTROLLER, OTHER)
# A run that outlasts the checks made while it runs (cpu-smoke steps take well under a second here).
LONG = {"train_steps": 100000}


def as_user(user: str, **settings: object) -> list[str]:
    return ["--extra-vars", json.dumps({"cluster_user": user, **settings})]


def run_record(run_id: str) -> dict:
    return json.loads((ARTIFACTS / run_id / "run.json").read_text())


def slurm_job(job_id: str) -> dict[str, str]:
    line = node_exec(CONTROLLER, "scontrol", "show", "job", "-o", job_id).stdout
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def leftovers(node: str) -> str:
    return node_exec(node, "pgrep", "-af", "torchrun|train.py|ddp_node.py launch").stdout.strip()


def run_id_of(output: str) -> str:
    return re.search(r"^  full Ansible output: .*/([^/]+)/ansible\.log$", output, re.MULTILINE).group(1)


def wait_idle(within_s: float = 120) -> None:
    deadline = time.monotonic() + within_s
    while True:
        states = node_exec(CONTROLLER, "sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")
        if all(line.endswith(" idle") for line in states if line.strip()):
            return
        assert time.monotonic() < deadline, states
        time.sleep(1)


def test_two_users_launch_at_once_one_waits_in_the_queue_and_both_train_with_their_own_artifacts():
    wait_idle()
    runs = {user: start_cli_training(*as_user(user)) for user in ("alice", "bob")}
    outputs = {user: train.communicate(timeout=600)[0] for user, train in runs.items()}
    for user, train in runs.items():
        assert train.returncode == 0, outputs[user][-3000:]
    queued = [user for user, output in outputs.items() if "queued in Slurm as job" in output]
    assert queued, {user: output[-2000:] for user, output in outputs.items()}
    assert re.search(r"\] queued in Slurm as job \d+: 1 of 1 waiting \((Resources|Priority)\)", outputs[queued[0]])
    records = {user: run_record(run_id_of(output)) for user, output in outputs.items()}
    jobs = {user: slurm_job(record["slurm"]["job_id"]) for user, record in records.items()}
    for user, record in records.items():
        assert record["status"] == "succeeded" and record["owner"] == user, record
        assert jobs[user]["UserId"].startswith(f"{user}("), jobs[user]
        assert (ARTIFACTS / record["run_id"] / "checkpoints").is_dir()
    first, second = sorted(jobs.values(), key=lambda job: job["StartTime"])
    assert first["EndTime"] <= second["StartTime"], (first, second)
    table = cli("runs").stdout
    for user, record in records.items():
        assert re.search(rf"^{re.escape(record['run_id'])} .* {user}$", table, re.MULTILINE), table


def test_stop_cancels_the_run_and_is_refused_for_another_users_run():
    wait_idle()
    started = cli("train", "--detach", *as_user("alice", **LONG))
    assert started.returncode == 0, started.stdout + started.stderr
    run_id, job_id = re.search(
        r"^run (\S+) is submitted to Slurm as job (\d+), detached", started.stdout, re.M
    ).groups()
    deadline = time.monotonic() + 180
    while "step " not in (status := cli("status", "--run", run_id)).stdout:
        assert time.monotonic() < deadline, status.stdout + status.stderr

    refused = cli("stop", "--run", run_id, *as_user("bob"))
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0
    assert f"Slurm refused to cancel job {job_id} (run {run_id}) for bob: it is alice's" in said, said
    assert slurm_job(job_id)["JobState"] == "RUNNING"
    assert run_record(run_id)["status"] == "running"

    # Bob's run waits behind it, and says where; he cancels it while it waits.
    waiting = cli("train", "--detach", *as_user("bob"))
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    submitted = re.search(r"^run (\S+) is submitted to Slurm as job (\d+)", waiting.stdout, re.MULTILINE)
    bob_run, bob_job = submitted.groups()
    status = cli("status", "--run", bob_run, *as_user("bob"))
    assert f"queued in Slurm as job {bob_job}: 1 of 1 waiting (Resources)" in status.stdout, status.stdout
    cancelled = cli("stop", "--run", bob_run, *as_user("bob"))
    assert cancelled.returncode == 0 and f"run {bob_run}: cancelled" in cancelled.stdout, cancelled.stdout
    assert slurm_job(bob_job)["JobState"] == "CANCELLED"
    assert slurm_job(job_id)["JobState"] == "RUNNING"

    stopped = cli("stop", "--run", run_id, *as_user("alice"))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"run {run_id}: cancelled" in stopped.stdout, stopped.stdout
    assert slurm_job(job_id)["JobState"] in {"CANCELLED", "COMPLETED", "FAILED"}
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"


def test_a_run_directory_that_is_not_shared_is_refused_before_slurm_gets_a_job():
    # /var/tmp is each node's own: node1 does not see the work dir the master made there.
    done = cli("train", *as_user("alice", shared_dir="/var/tmp/alice-unshared"))
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    said = " ".join(output.split())
    assert re.search(
        rf"host {OTHER} does not see the run's work dir /var/tmp/alice-unshared/\S+, which the master made: with "
        r"several nodes it must be on storage every node shares",
        said,
    ), output[-3000:]
    assert f"{OTHER} could not write its part of the batch job (above): nothing was submitted" in said, said
    assert "submitted to Slurm" not in output
    assert node_exec(CONTROLLER, "squeue", "-h", "-u", "alice").stdout.strip() == ""


def long_run_until_its_first_step() -> tuple[subprocess.Popen[str], str]:
    """alice's long run, once the cluster is idle, read until its master reports steps; the run and what it
    printed so far."""
    wait_idle()
    train = start_cli_training(*as_user("alice", **LONG))
    output = []
    for line in train.stdout:
        output.append(line)
        if "] step " in line:
            break
    return train, "".join(output)


def test_ctrl_c_on_make_train_cancels_the_slurm_job():
    train, output = long_run_until_its_first_step()
    os.killpg(train.pid, signal.SIGINT)  # what Ctrl-C does to make train's process group
    output_text = output + train.communicate(timeout=180)[0]
    assert train.returncode == -signal.SIGINT, output_text[-3000:]
    record = run_record(output_text.split("interrupted: stopping run ")[1].split()[0])
    assert record["status"] == "cancelled", record
    assert slurm_job(record["slurm"]["job_id"])["JobState"] == "CANCELLED"
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"


def test_a_node_slurm_loses_fails_the_run_naming_it_and_the_next_run_trains():
    train, output = long_run_until_its_first_step()
    subprocess.run(["docker", "exec", container(OTHER), "pkill", "-KILL", "-x", "slurmd"], check=True)
    output_text = output + train.communicate(timeout=300)[0]
    assert train.returncode != 0, output_text[-3000:]
    record = run_record(run_id_of(output_text))
    assert record["status"] == "failed" and record["failed_node"] == OTHER, record
    assert re.match(rf"Slurm ended job {record['slurm']['job_id']} NODE_FAIL", record["reason"]), record

    wait_idle()
    again = start_cli_training(*as_user("alice"))
    again_output = again.communicate(timeout=600)[0]
    assert again.returncode == 0, again_output[-3000:]
