"""The two-host proof, run from the controller against the two test hosts that molecule created."""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import ansible_runner
import pytest

ROOT = Path(os.environ["DDP_REPO_ROOT"])
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
ARTIFACTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "artifacts"
NODES = ("train-node0", "train-node1")


def run_dirs():
    return sorted(p for p in ARTIFACTS.iterdir() if p.is_dir()) if ARTIFACTS.exists() else []


def metrics(run_dir):
    lines = (run_dir / "metrics" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def train(**extravars):
    """Runs the launch playbook against the test hosts; returns the runner and the new run's directory."""
    before = set(run_dirs())
    private_dir = ARTIFACTS.parent / "runner"
    private_dir.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(private_dir),
        project_dir=str(ROOT),
        playbook=str(ROOT / "ansible/playbooks/train.yml"),
        inventory=str(INVENTORY),
        extravars=extravars,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles"),
        },
        quiet=True,
    )
    new = sorted(set(run_dirs()) - before)
    return runner, (new[-1] if new else None)


def node_exec(node, *command):
    return subprocess.run(["docker", "exec", node, *command], capture_output=True, text=True, check=False)


def leftovers(node):
    """Processes of a training run still alive on a node (pgrep leaves itself out)."""
    return node_exec(node, "pgrep", "-af", "torchrun|train.py|ddp_node.py launch").stdout.strip()


@pytest.fixture(scope="module")
def converge_run():
    runs = run_dirs()
    assert runs, "converge collected no run"
    return runs[0]


def test_trained_across_both_hosts_and_loss_fell(converge_run):
    summary = json.loads((converge_run / "metrics/summary.json").read_text())
    assert summary["world_size"] == 2
    losses = [m["loss"] for m in metrics(converge_run)]
    assert len(losses) >= 10
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


def test_checkpoint_and_logs_collected_and_manifest_verifies(converge_run):
    assert list((converge_run / "checkpoints").glob("*.pt")), "no checkpoint collected"
    assert {p.parent.name for p in (converge_run / "logs").glob("*/node.log")} == set(NODES)
    check = subprocess.run(
        ["sha256sum", "-c", "MANIFEST.sha256"], cwd=converge_run, capture_output=True, text=True, check=False
    )
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
    outcome = {}

    def long_run():
        outcome["runner"], outcome["run_dir"] = train(train_resume="never", train_steps=100000)

    worker = threading.Thread(target=long_run)
    worker.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not node_exec("train-node1", "pgrep", "-f", "train.py").stdout:
        time.sleep(1)
    time.sleep(10)  # well into the run: past rendezvous, taking steps
    node_exec("train-node1", "pkill", "-KILL", "-f", "bin/torchrun")
    killed_at = time.monotonic()
    worker.join(timeout=180)
    assert not worker.is_alive(), "the play did not end after a node's torchrun was killed"
    elapsed = time.monotonic() - killed_at
    runner = outcome["runner"]
    output = runner.stdout.read()
    assert runner.rc != 0
    assert elapsed < 60, f"the play took {elapsed:.0f} s to fail"
    assert "failed on node train-node1" in output
    for node in NODES:
        assert leftovers(node) == "", f"{node} still runs: {leftovers(node)}"
