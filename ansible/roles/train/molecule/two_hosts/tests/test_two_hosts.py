"""The two-host proof, run from the controller against the two test hosts that molecule created."""

import pytest
from train_run import break_a_run, manifest_check, metrics, node_exec, run_dirs, summary, train

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
    assert runner.rc == 0, runner.stdout.read()[-3000:]
    assert metrics(run_dir)[0]["step"] == first_last_step + 1


def test_killing_torchrun_on_one_node_fails_the_play_naming_it():
    broken = break_a_run("train-node1", ("pkill", "-KILL", "-f", "bin/torchrun"))
    assert broken.rc != 0
    assert broken.seconds_to_fail < 60, f"the play took {broken.seconds_to_fail:.0f} s to fail"
    assert "failed on node train-node1" in broken.output
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"
