"""The whole flow on two real-kernel nodes (`make e2e`): site.yml converges the lab VMs and a rerun changes
nothing; `make train` runs one rank on each VM in the docker runtime with checkpoints on the NFS share; the
collected checkpoint matches the one on NFS; an NFS server restart mid-run loses neither the job nor a
checkpoint. Tests run in file order and share one lab (tests/e2e/conftest.py)."""

import hashlib
import subprocess

from lab import CLIENT, NODES, SERVER, BackgroundTraining, on, recap, wait_for_step

JOB_DIR = "/data/ddp/lab"


def test_site_converges(site_runs):
    first, _ = site_runs
    assert first.rc == 0, first.output[-4000:]
    assert set(recap(first.output)) >= set(NODES)


def test_site_rerun_changes_nothing(site_runs):
    _, second = site_runs
    assert second is not None and second.rc == 0, (second.output if second else "no rerun")[-4000:]
    changed = {host: counts["changed"] for host, counts in recap(second.output).items() if counts["changed"]}
    assert not changed, f"the rerun changed something on {changed}:\n{second.output[-4000:]}"


def test_shared_dir_is_an_nfs_mount_of_the_server_on_the_client(site_runs):
    mount = on(CLIENT, "findmnt -n -o FSTYPE,SOURCE /data")
    assert mount.stdout.split() == ["nfs4", "10.213.60.10:/data"], mount.stdout + mount.stderr


def test_training_spans_both_vms_and_loss_falls(first_training):
    assert first_training.result.rc == 0, first_training.result.output[-4000:]
    summary, steps = first_training.summary(), first_training.metrics()
    assert summary["world_size"] == 2, summary
    assert steps[0]["step"] == 1, "RESUME=never must start from step 1"
    assert steps[-1]["loss"] < steps[0]["loss"], [(s["step"], s["loss"]) for s in steps]


def test_ran_in_the_training_image_whose_containers_are_gone_afterwards(first_training):
    assert first_training.result.rc == 0
    for node in NODES:
        # The VMs have no torch of their own: a job that trained there ran inside the image.
        assert on(node, "python3 -c 'import torch'").returncode != 0, f"{node} has torch outside the image"
        left = on(node, "docker ps -aq --filter name=ddp-")
        assert left.returncode == 0 and not left.stdout.strip(), f"{node} still has {left.stdout}"


def test_checkpoint_on_nfs_is_collected_and_its_checksums_verify(first_training):
    assert first_training.result.rc == 0
    run_dir = first_training.run_dir
    checked = subprocess.run(
        ["sha256sum", "-c", "MANIFEST.sha256"], cwd=run_dir, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [collected] = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    digest = hashlib.sha256(collected.read_bytes()).hexdigest()
    # The same file, read through the client's NFS mount, against the sidecar the trainer wrote.
    on_client = on(
        CLIENT, f"cd {JOB_DIR}/checkpoints && sha256sum -c {collected.name}.sha256 && sha256sum {collected.name}"
    )
    assert on_client.returncode == 0, on_client.stdout + on_client.stderr
    assert on_client.stdout.split()[-2] == digest


def test_nfs_server_restart_mid_run_loses_neither_the_job_nor_a_checkpoint(first_training):
    assert first_training.result.rc == 0
    last_step = first_training.metrics()[-1]["step"]
    # Past the step-25 checkpoint, before the step-50 one: the restart falls between two saves.
    run = BackgroundTraining("RESUME=auto", "EXTRA_VARS=train_steps=30")
    wait_for_step("lab", last_step + 8, timeout=900, still_running=run)
    restarted = on(SERVER, "systemctl restart nfs-server && systemctl is-active nfs-server")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    training = run.wait(timeout=1200)
    assert training.result.rc == 0, training.result.output[-4000:]
    steps = [m["step"] for m in training.metrics()]
    assert steps[0] == last_step + 1 and steps[-1] == last_step + 30, steps
    checkpoints = on(CLIENT, f"cd {JOB_DIR}/checkpoints && sha256sum -c *.sha256")
    assert checkpoints.returncode == 0, checkpoints.stdout + checkpoints.stderr
    assert f"ckpt-{last_step + 30:08d}.pt: OK" in checkpoints.stdout, checkpoints.stdout
