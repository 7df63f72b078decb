"""The node runner's part of a run under Slurm that runs without Slurm: the step script arm writes (run here as
Slurm's step would run it), and how a job Slurm ended is judged. Submission, the queue and cancel run against
real Slurm daemons in the slurm role's scenario (tests/test_slurm_train.py)."""

import json
import os
import platform
import subprocess

from _node_runner import ROOT, ddp_node, run_runner
from ddp_launcher import control

HOSTS = {"node0": "n0", "node1": "n1"}


def test_the_step_arm_writes_runs_the_command_with_the_nodes_environment_and_records_its_end(tmp_path):
    node_dir, shared, work = tmp_path / "node" / "run", tmp_path / "shared", tmp_path / "work"
    shared.mkdir()
    work.mkdir()
    env = os.environ | {"DDP_TEST_VALUE": "it's $HOME"}
    armed = run_runner(
        "arm", "--node-dir", str(node_dir), "--shared-dir", str(shared), "--arm-dir", str(shared),
        "--workdir", str(work), "--node", "node0", "--export", "DDP_TEST_VALUE",
        "--", "sh", "-c", 'echo "value: $DDP_TEST_VALUE in $(pwd)"', env=env,
    )  # fmt: skip
    assert armed.returncode == 0, armed.stderr
    host = json.loads(armed.stdout)["host"]
    assert host == platform.node().split(".")[0]
    # Slurm's step runs the script with an environment of the submitting node's, not this node's play.
    step = subprocess.run(
        ["sh", str(shared / f"step-{host}.sh")], env={"PATH": os.environ["PATH"]}, cwd=shared, check=False
    )
    assert step.returncode == 0
    # ... and in the run's work dir, as without Slurm, not where Slurm starts it.
    assert f"value: it's $HOME in {work}\n" in (node_dir / "node.log").read_text()
    assert json.loads((shared / "status-node0.json").read_text())["exit_code"] == 0
    # The copy it ran is the runner, in the run's node directory.
    assert (node_dir / "ddp_node.py").read_bytes() == (ROOT / "ansible/roles/train/files/ddp_node.py").read_bytes()


def test_a_node_that_does_not_see_the_run_s_work_dir_writes_no_part(tmp_path):
    """The master made the work dir on shared storage: a node without it has storage of its own there."""
    work = tmp_path / "shared" / "work"
    armed = run_runner(
        "arm", "--node-dir", str(tmp_path / "node"), "--shared-dir", str(tmp_path / "shared"),
        "--arm-dir", str(tmp_path / "shared" / "nodes"), "--workdir", str(work), "--node", "node1", "--", "true",
    )  # fmt: skip
    assert armed.returncode == 1 and armed.stdout == ""
    assert armed.stderr == (
        f"host node1 does not see the run's work dir {work}, which the master made: with several nodes it must be on "
        "storage every node shares (train_shared_dir / shared_dir, e.g. the NFS mount).\n"
    )
    assert not (tmp_path / "shared").exists()


def test_a_submit_that_does_not_see_every_node_s_part_is_refused_before_slurm_is_asked(tmp_path):
    """A peer whose run directory is not on shared storage wrote its part where the master cannot see it."""
    (tmp_path / "step-n0.sh").write_text("exit 0\n")
    done = run_runner("submit", "--arm-dir", str(tmp_path), "--name", "r1", "--hosts", "n0,n1")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"the master does not see the part of the run that n1 wrote to {tmp_path}: with 2 nodes it must be on "
        "storage every node shares (train_shared_dir / shared_dir, e.g. the NFS mount).\n"
    )
    assert not (tmp_path / "step.sh").exists()


def test_a_job_slurm_ended_for_its_own_reason_fails_the_run_whatever_the_ranks_say():
    lost_peer = {"job": "failed", "failed_node": "node0", "reason": "exit code 1", "exit_code": 1}
    ended = ddp_node.with_slurm_end(lost_peer, {"state": "NODE_FAIL", "nodes": ""}, "7", HOSTS, 0)
    assert ended == {"job": "failed", "failed_node": "node0", "reason": "Slurm ended job 7 NODE_FAIL", "exit_code": 1}
    running = {"job": "running"}
    assert ddp_node.with_slurm_end(running, {"state": "RUNNING", "nodes": "n[0-1]"}, "7", HOSTS, 99) == running


def test_a_part_still_counted_running_after_slurm_ended_the_job_fails_only_once_its_allowance_passed():
    running = {"job": "running"}
    assert ddp_node.with_slurm_end(running, {"state": "COMPLETED", "nodes": ""}, "7", HOSTS, 0) == running
    late = ddp_node.with_slurm_end(running, None, "7", HOSTS, 1)
    assert late["job"] == "failed" and late["reason"] == "Slurm ended job 7 ENDED", late
    succeeded = {"job": "succeeded"}
    assert ddp_node.with_slurm_end(succeeded, None, "7", HOSTS, 1) == succeeded


def test_the_queue_line_says_the_job_its_place_and_slurms_reason():
    job = {"id": "12", "state": "PENDING", "reason": "Resources", "position": 2, "waiting": 3}
    assert control.queue_line(job) == "queued in Slurm as job 12: 2 of 3 waiting (Resources)"
