"""The two-host proof, run from the controller against the two test hosts that molecule created."""

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import jobs
import pytest
from jobs import FLAKY, HANG
from testhosts import container
from train_run import (
    ARTIFACTS,
    Background,
    break_a_run,
    cli,
    manifest_check,
    metrics,
    node_exec,
    node_logs,
    play_failure,
    run_dirs,
    start_cli_training,
    summary,
    train,
    tutorial_workdir,
    wait_for,
)

NODES = ("train-node0", "train-node1")


def leftovers(node):
    """Processes of a training run still alive on a node (pgrep leaves itself out)."""
    return node_exec(node, "pgrep", "-af", "torchrun|train.py|ddp_node.py launch").stdout.strip()


@pytest.fixture(scope="module")
def converge_run():
    runs = run_dirs()
    assert runs, "converge collected no run"
    return runs[0]


def test_trained_across_both_hosts_and_loss_fell(converge_run):
    assert summary(converge_run)["world_size"] == 2
    losses = [m["loss"] for m in metrics(converge_run)]
    assert len(losses) >= 10
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


def test_checkpoint_and_logs_collected_and_manifest_verifies(converge_run):
    assert list((converge_run / "checkpoints").glob("*.pt")), "no checkpoint collected"
    assert {p.parent.name for p in (converge_run / "logs").glob("*/node.log")} == set(NODES)
    check = manifest_check(converge_run)
    assert check.returncode == 0, check.stdout + check.stderr


def test_nothing_left_running_after_the_run(converge_run):
    for node in NODES:
        assert leftovers(node) == "", node


def test_second_run_resumes_after_the_first(converge_run):
    first_last_step = metrics(converge_run)[-1]["step"]
    runner, run_dir = train(train_resume="auto", train_steps=6)
    assert runner.rc == 0, play_failure(runner.stdout.read())
    assert metrics(run_dir)[0]["step"] == first_last_step + 1


def test_own_script_resumes_from_its_snapshot_on_shared_storage_on_every_node(tmp_path):
    shipped = tutorial_workdir(tmp_path / "tutorial", version="1")
    runner, first = train(train_job_name="tutorial", train_program_args=["4", "2"], **shipped)
    assert runner.rc == 0, play_failure(runner.stdout.read())
    assert node_exec("train-node1", "test", "-s", "/data/ddp/tutorial/work/snapshot.pt").returncode == 0
    assert "  work/snapshot.pt\n" in (first / "MANIFEST.sha256").read_text()

    runner, second = train(train_job_name="tutorial", train_program_args=["6", "2"], **shipped)
    assert runner.rc == 0, play_failure(runner.stdout.read())
    # One rank per node: whichever node saved the snapshot as rank 0, the other read it from shared storage.
    logs = node_logs(second)
    assert set(logs) == set(NODES)
    for node, log in logs.items():
        assert "Resuming training from snapshot at epoch 4" in log, f"{node}:\n{log[-2000:]}"


ADVERSARY = Path(jobs.__file__).parent / "adversary"  # the job the unit tier runs on inventory/local too
SECRET = "/etc/ddp-adversary-secret"  # root's alone (0600), where a link can name it


def test_a_job_that_tries_to_reach_what_is_not_its_own_reaches_nothing(converge_run):
    """Ansible connects as root and the job runs as the cluster user (molecule/shared/adversary/attack.py says
    what it tries).
    Nothing root does afterwards (the polls, collect, the fetch, a status of an older run) may hand it the
    secret, and an older run's artifacts stay as they were."""
    token = f"secret-{uuid.uuid4().hex}"
    for node in NODES:
        assert node_exec(node, "sh", "-c", f"umask 077 && echo {token} > {SECRET}").returncode == 0
    earlier = jobs.tree_hashes(converge_run)
    runner, run_dir = train(
        train_job_name="adversary", train_workdir=str(ADVERSARY), train_program="attack.py", train_program_args=[SECRET]
    )
    assert runner.rc == 0, play_failure(runner.stdout.read())
    reports = [json.loads(path.read_text()) for path in sorted((run_dir / "work").glob("attempts-*.json"))]
    assert len(reports) == len(NODES), sorted((run_dir / "work").iterdir())
    for attempts in reports:
        assert attempts["uid"] != 0
        jobs.assert_reached_nothing(attempts)
    assert list((run_dir / "work").glob("*leak*")) == []
    assert manifest_check(run_dir).returncode == 0
    leaked = [path for path in ARTIFACTS.rglob("*") if path.is_file() and token.encode() in path.read_bytes()]
    assert leaked == []

    again = cli("status", "--run", converge_run.name)
    assert again.returncode == 0, again.stdout + again.stderr
    assert jobs.tree_hashes(converge_run) == earlier


COUNT_DATA = """import os, pathlib
data = pathlib.Path(os.environ["DDP_DATA_DIR"])
print("dataset holds:", ",".join(sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())))
"""


def test_a_dataset_reaches_shared_storage_as_the_job_s_and_every_node_reads_it(tmp_path):
    dataset = tmp_path / "dataset"
    (dataset / "sub").mkdir(parents=True)
    (dataset / "a.bin").write_bytes(b"a" * 4096)
    (dataset / "sub" / "b.txt").write_text("b")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "count.py").write_text(COUNT_DATA)
    runner, run_dir = train(
        train_job_name="data",
        train_workdir=str(tmp_path / "code"),
        train_program="count.py",
        train_data_dir=str(dataset),
        train_data_name="two-hosts-data",
    )
    assert runner.rc == 0, play_failure(runner.stdout.read())
    for node, log in node_logs(run_dir).items():
        assert "dataset holds: a.bin,sub/b.txt" in log, f"{node}:\n{log[-2000:]}"
    owners = node_exec("train-node1", "stat", "-c", "%U %a %s", "/data/data/two-hosts-data/a.bin").stdout.split()
    assert owners[0] != "root" and owners[2] == "4096", owners
    assert json.loads((run_dir / "run.json").read_text())["data"]["sent_files"] == 2


def test_a_run_that_fails_once_is_retried_across_both_hosts_from_its_checkpoint(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "flaky.py").write_text(FLAKY)
    job = f"flaky-{uuid.uuid4().hex[:6]}"
    program = ["--program", str(tmp_path / "code" / "flaky.py"), "--args", "3", "--job", job]
    done = cli("train", *program, "--extra-vars", '{"train_retries": 1}')
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attempt 1 of 2 failed on train-node0: exit code 3; retrying as attempt 2" in done.stdout, done.stdout
    [retried] = [run for run in run_dirs() if run.name.startswith(job) and run.name.endswith("-try2")]
    attempts = json.loads((retried / "run.json").read_text())["attempts"]
    assert [(a["status"], a["exit_code"]) for a in attempts] == [("failed", 3), ("succeeded", None)]
    assert "resumed from ckpt-000005.pt" in node_logs(retried)["train-node0"]


def test_a_rank_wedged_before_a_collective_is_stopped_naming_its_node_with_the_ranks_stacks(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "hang.py").write_text(HANG)
    job = f"hang-{uuid.uuid4().hex[:6]}"
    program = ["--program", str(tmp_path / "code" / "hang.py"), "--job", job]
    done = cli("train", *program, "--extra-vars", '{"train_hang_after_s": 10}')
    assert done.returncode != 0
    # The last rank (train-node1's) wedged before step 3; train-node0's rank waits for it in the all-reduce.
    assert re.search(
        r"failed on node train-node1: no progress for \d+ s \(train_hang_after_s\): the ranks of train-node1 stopped "
        r"at step 2\.",
        done.stderr,
    ), done.stderr
    [run] = [run for run in run_dirs() if run.name.startswith(job)]
    logs = node_logs(run)
    assert re.search(r"rank 1 \(pid \d+\):\n.*\n\s+<module> \(hang.py:9\)", logs["train-node1"]), logs["train-node1"]
    assert re.search(r"rank 0 \(pid \d+\):\n.*\n\s+all_reduce \(", logs["train-node0"]), logs["train-node0"]
    for node in NODES:
        assert leftovers(node) == "", node


LONG_RUN = '{"train_steps": 100000, "train_resume": "never", "train_job_name": "%s"}'


def test_ctrl_c_on_make_train_stops_every_node_collects_and_marks_it_cancelled():
    train = start_cli_training("--extra-vars", LONG_RUN % "sigint")
    output = []
    for line in train.stdout:  # until the master reports steps
        output.append(line)
        if "] step " in line:
            break
    interrupted_at = time.monotonic()
    os.killpg(train.pid, signal.SIGINT)  # what Ctrl-C does to make train's process group
    rest, _ = train.communicate(timeout=120)
    output = "".join(output) + rest
    assert train.returncode == -signal.SIGINT, output[-3000:]  # dies of it: a shell shows 130
    assert time.monotonic() - interrupted_at < 60, output[-3000:]
    run_id = output.split("interrupted: stopping run ")[1].split()[0]
    assert json.loads((ARTIFACTS / run_id / "run.json").read_text())["status"] == "cancelled"
    assert f"{run_id:<36} sigint           cancelled" in cli("runs").stdout
    assert {p.parent.name for p in (ARTIFACTS / run_id / "logs").glob("*/node.log")} == set(NODES)
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"


def test_a_detached_run_is_watched_followed_and_stopped_from_other_commands():
    started = cli("train", "--detach", "--extra-vars", LONG_RUN % "detached")
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = re.search(r"^run (\S+) is running on every node", started.stdout, re.MULTILINE).group(1)
    assert f"make stop RUN={run_id}" in started.stdout
    for node in NODES:
        assert leftovers(node), f"{node} does not run its part"

    deadline = time.monotonic() + 120
    while "step " not in (status := cli("status", "--run", run_id)).stdout:
        assert time.monotonic() < deadline, status.stdout + status.stderr
    assert "job: running" in status.stdout
    for node in NODES:
        assert f"[{node}] running, heartbeat" in status.stdout, status.stdout

    logs = cli("logs", "--run", run_id)
    for node in NODES:
        assert f"[{node}] " in logs.stdout, logs.stdout[-2000:] + logs.stderr
    one = cli("logs", "--run", run_id, "--node", "train-node1")
    assert "[train-node1] " in one.stdout and "[train-node0] " not in one.stdout

    stopped = cli("stop", "--run", run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"run {run_id}: cancelled" in stopped.stdout
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"
    assert f"{run_id:<36} detached         cancelled" in cli("runs").stdout


def test_doctor_measures_both_directions_and_an_allreduce_across_both_nodes():
    done = cli("doctor")
    assert "doctor.json and report.md:" in done.stdout, done.stdout + done.stderr
    report = json.loads((sorted(ARTIFACTS.glob("doctor-*/doctor.json"))[-1]).read_text())
    assert {(p["client"], p["server"]) for p in report["pairs"]} == {NODES, NODES[::-1]}
    assert all(p["iperf3"]["gbit_per_s"] > 0 for p in report["pairs"]), report["pairs"]
    assert report["allreduce"]["world_size"] == 2
    for node in NODES:
        assert f"PASS  interfaces on {node}" in done.stdout
        assert f"INFO  TCP {node} -> " in done.stdout


def test_doctor_names_a_gloo_interface_a_node_lacks():
    done = cli("doctor", "--extra-vars", '{"train_env": {"GLOO_SOCKET_IFNAME": "eth7", "OMP_NUM_THREADS": "1"}}')
    assert done.returncode == 1, done.stdout + done.stderr
    for node in NODES:
        assert f"GLOO_SOCKET_IFNAME=eth7 in train_env on {node}: no such interface" in done.stdout, done.stdout


def test_killing_torchrun_on_one_node_fails_the_play_naming_it():
    broken = break_a_run("train-node1", ("pkill", "-KILL", "-f", "bin/torchrun"))
    assert broken.rc != 0
    assert broken.seconds_to_fail < 60, f"the play took {broken.seconds_to_fail:.0f} s to fail"
    assert "failed on node train-node1" in broken.output
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"


# Slower steps (a wider network) and frequent checkpoints, so a fault lands mid-run after a checkpoint.
SLOW_ARGS = [
    *("--config", "{{ train_config }}", "--steps", "{{ train_steps }}"),
    *("--checkpoint-dir", "{{ train_checkpoint_dir }}", "--output-dir", "{{ train_output_dir }}", "--resume", "auto"),
    *("--set", "model.width=128", "--checkpoint-every", "10"),
]


def checkpoints(job):
    listing = node_exec("train-node0", "sh", "-c", f"ls /data/ddp/{job}/checkpoints/ | grep '^ckpt-.*pt$'").stdout
    return [int(name.removeprefix("ckpt-").removesuffix(".pt")) for name in listing.split()]


def test_a_killed_rank_is_restarted_and_the_job_finishes_from_its_checkpoint():
    run = Background(train_job_name="restart", train_steps=150, train_max_restarts=1, train_program_args=SLOW_ARGS)
    wait_for("train-node0", "sh", "-c", "ls /data/ddp/restart/checkpoints/ckpt-*.pt")
    # The rank (torchrun starts it as `python -u train.py`), not torchrun, whose command line names train.py too.
    node_exec("train-node1", "pkill", "-KILL", "-f", " -u .*train/train.py")
    run.wait(timeout=600)
    assert run.runner.rc == 0, play_failure(run.runner.stdout.read())
    # summary.json is the last attempt's: it started from a checkpoint and reached the target.
    resumed_from = summary(run.run_dir)["resumed_from_step"]
    assert resumed_from >= 10
    # The restarted attempt keeps the metrics of the lineage it resumed (steps up to resumed_from) and logs the
    # rest once: every step exactly once, in order, nothing lost or repeated across the restart.
    steps = [m["step"] for m in metrics(run.run_dir)]
    assert steps == list(range(1, 151)), "steps lost or repeated across the restart"


def test_a_stopped_node_fails_the_play_and_a_rerun_resumes_from_the_last_checkpoint():
    run = Background(train_job_name="stopped", train_steps=100000, train_program_args=SLOW_ARGS)
    wait_for("train-node0", "sh", "-c", "ls /data/ddp/stopped/checkpoints/ckpt-*.pt")
    subprocess.run(["docker", "stop", "--time", "5", container("train-node1")], check=True, capture_output=True)
    try:
        run.wait(timeout=300)
        output = run.runner.stdout.read()
        assert run.runner.rc != 0
        assert "failed on node train-node1" in output, play_failure(output)
        assert leftovers("train-node0") == ""
    finally:
        subprocess.run(["docker", "start", container("train-node1")], check=True, capture_output=True)
        node_exec("train-node1", "systemctl", "is-system-running", "--wait")
    last_saved = max(checkpoints("stopped"))
    runner, run_dir = train(train_job_name="stopped", train_steps=5, train_program_args=SLOW_ARGS)
    assert runner.rc == 0, play_failure(runner.stdout.read())
    assert metrics(run_dir)[0]["step"] == last_saved + 1
