"""One image everywhere, and training inside it across both test hosts (driven from the controller)."""

import json
import subprocess

import pytest
from demo_wheels import demo_index
from testhosts import container
from train_run import (
    ROOT,
    break_a_run,
    manifest_check,
    metrics,
    node_exec,
    node_logs,
    play_failure,
    summary,
    train,
    tutorial_workdir,
)

NODES = ("img-node0", "img-node1")
IMAGE = "ddp-train:cpu"


def image_id(*docker_prefix: str) -> str:
    command = [*docker_prefix, "docker", "image", "inspect", "--format", "{{.Id}}", IMAGE]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def run_containers(node: str) -> str:
    """Containers of a training run on a node, running or stopped."""
    return node_exec(node, "docker", "ps", "--all", "--filter", "name=ddp-", "--format", "{{.Names}}").stdout.strip()


def test_every_node_holds_the_controllers_image():
    controller = image_id()
    assert controller.startswith("sha256:")
    assert {node: image_id("docker", "exec", container(node)) for node in NODES} == dict.fromkeys(NODES, controller)


def test_image_labels_record_the_versions_inside():
    labels = json.loads(
        node_exec(NODES[1], "docker", "image", "inspect", "--format", "{{json .Config.Labels}}", IMAGE).stdout
    )
    inside = json.loads(node_exec(NODES[1], "docker", "run", "--rm", "--network", "none", IMAGE).stdout)
    requirements = (ROOT / "container/requirements-cpu.txt").read_text().splitlines()
    pinned = next(line.split("==")[1] for line in requirements if line.startswith("torch=="))
    assert labels["ddp.torch"] == inside["torch"] == pinned
    assert labels["ddp.variant"] == "cpu"


def test_image_runs_as_a_non_root_user():
    assert node_exec(NODES[0], "docker", "run", "--rm", "--network", "none", IMAGE, "id", "-un").stdout.strip() == "ddp"


@pytest.fixture(scope="module")
def docker_run():
    runner, run_dir = train(train_steps=30)
    assert runner.rc == 0, play_failure(runner.stdout.read())
    assert run_dir is not None
    return run_dir


def test_trains_inside_the_image_across_both_nodes(docker_run):
    assert summary(docker_run)["world_size"] == 2
    losses = [m["loss"] for m in metrics(docker_run)]
    assert len(losses) >= 10
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, losses


def test_checkpoint_collected_and_manifest_verifies(docker_run):
    assert list((docker_run / "checkpoints").glob("*.pt")), "no checkpoint collected"
    check = manifest_check(docker_run)
    assert check.returncode == 0, check.stdout + check.stderr


def test_no_container_left_after_the_run(docker_run):
    for node in NODES:
        assert run_containers(node) == "", node


def test_a_failed_nodes_container_is_removed_and_the_play_names_it():
    broken = break_a_run("img-node1", ("sh", "-c", "docker kill $(docker ps -q --filter name=ddp-)"))
    assert broken.rc != 0
    assert "failed on node img-node1" in broken.output, play_failure(broken.output)
    for node in NODES:
        assert run_containers(node) == "", f"{node} still has {run_containers(node)}"


def test_a_code_change_runs_in_the_same_image(tmp_path):
    images = {node: image_id("docker", "exec", container(node)) for node in NODES}
    for version in ("1", "2"):
        shipped = tutorial_workdir(tmp_path / "tutorial", version)
        runner, run_dir = train(train_job_name="tutorial-docker", train_program_args=["2", "1"], **shipped)
        assert runner.rc == 0, play_failure(runner.stdout.read())
        for node, log in node_logs(run_dir).items():
            assert f"code version {version}" in log, f"{node} did not run version {version}:\n{log[-2000:]}"
    assert {node: image_id("docker", "exec", container(node)) for node in NODES} == images


ENV_PROGRAM = """import os, ddp_demo_dep, torch
print("dep says", ddp_demo_dep.VALUE, "from", ddp_demo_dep.__file__, "with torch", torch.__version__)
"""


def test_requirements_reach_the_job_inside_the_image_without_a_rebuild(tmp_path):
    """The environment is built once on shared storage with the image's own pip, and mounted where the job runs."""
    images = {node: image_id("docker", "exec", container(node)) for node in NODES}
    code = tmp_path / "code"
    code.mkdir()
    (code / "main.py").write_text(ENV_PROGRAM)
    (code / "requirements.txt").write_text("ddp-demo-dep==1.0\n")
    runner, run_dir = train(
        train_job_name="env-docker",
        train_workdir=str(code),
        train_program="main.py",
        train_index_options=["--no-index", "--find-links", str(demo_index(tmp_path / "wheels"))],
    )
    assert runner.rc == 0, play_failure(runner.stdout.read())
    torch_inside = json.loads(
        node_exec(NODES[0], "docker", "image", "inspect", "--format", "{{json .Config.Labels}}", IMAGE).stdout
    )
    for node, log in node_logs(run_dir).items():
        assert "dep says 1.0 from /data/ddp/envs/" in log, f"{node}:\n{log[-2000:]}"
        assert f"with torch {torch_inside['ddp.torch']}" in log, f"{node}:\n{log[-2000:]}"
    assert {node: image_id("docker", "exec", container(node)) for node in NODES} == images
