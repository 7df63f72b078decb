"""The whole flow on two real-kernel nodes (`make e2e`): site.yml converges the lab VMs and a rerun changes
nothing; `make train` runs one rank on each VM in the docker runtime with checkpoints on the NFS share, and
the NFS server is stopped for 10 s mid-run, holding the client's writes to the share until it is back; the job
still finishes, every checkpoint stays valid, and the collected one matches the one on NFS. Tests share one lab
and one training run (tests/e2e/conftest.py)."""

import hashlib
import importlib.util
import json
import re
import subprocess
import sys

from lab import ARTIFACTS, CHECKPOINTS, CLIENT, CLUSTER_USER, INVENTORY, JOB, NODES, ROOT, STEPS, on, recap, train


def bench(*argv: str) -> dict:
    """`ddp bench` on the lab inventory with argv; the bench.json it wrote (its table printed)."""
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launcher", "bench", "--inventory", str(INVENTORY), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    written = done.stdout.strip().splitlines()[-1].removeprefix("bench.json: ")
    return json.loads((ARTIFACTS / written).read_text())


def test_site_converges(site_runs):
    first, _ = site_runs
    assert first.rc == 0, first.output[-4000:]
    assert set(recap(first.output)) >= set(NODES)


def test_site_rerun_changes_nothing(site_runs):
    _, second = site_runs
    assert second is not None and second.rc == 0, (second.output if second else "no rerun")[-4000:]
    changed = {host: counts["changed"] for host, counts in recap(second.output).items() if counts["changed"]}
    assert not changed, f"the rerun changed something on {changed}:\n{second.output[-4000:]}"


def test_bench_records_the_noop_rerun_against_the_converge(site_runs):
    """make bench's p3, from the two site.yml runs this stage makes anyway (TCG inflates each task's fixed cost,
    so the lab's ratio is an upper bound of a real cluster's)."""
    first, second = site_runs
    assert second is not None and second.rc == 0
    changed = sum(counts["changed"] for counts in recap(second.output).values())
    site_seconds = [str(round(first.seconds, 1)), str(round(second.seconds, 1)), str(changed)]
    p3 = bench("--only", "p3", "--site-seconds", *site_seconds)["p3_noop_rerun_over_converge"]
    assert p3["rerun_changed"] == 0 and 0 < p3["value"] < 1, p3


def test_shared_dir_is_an_nfs_mount_of_the_server_on_the_client(site_runs):
    mount = on(CLIENT, "findmnt -n -o FSTYPE,SOURCE /data")
    assert mount.stdout.split() == ["nfs4", "10.213.60.10:/data"], mount.stdout + mount.stderr


def test_training_spans_both_vms_and_loss_falls(training):
    result = training.training.result
    assert result.rc == 0, result.output[-4000:]
    summary, steps = training.training.summary(), training.training.metrics()
    assert summary["world_size"] == 2, summary
    assert steps[-1]["loss"] < steps[0]["loss"], [(s["step"], s["loss"]) for s in steps]


def test_bench_records_the_launch_overhead_around_the_lab_s_training(training):
    """make bench's p6_lab_overhead_over_training, from this stage's training run: what the launch, the checks,
    the stop and the collection cost around the program's own training time (printed: a target, not a test)."""
    run = training.training
    assert run.result.rc == 0 and run.run_dir, run.result.output[-4000:]
    launch_s = f"{run.result.seconds:.1f}"
    figure = bench("--only", "p6lab", "--launch-seconds", launch_s, "--run-dir", str(run.run_dir))
    figure = figure["p6_lab_overhead_over_training"]
    training_s = run.summary()["wall_time_s"]
    assert figure["training_s"] == round(training_s, 1) and figure["launch_s"] == float(launch_s), figure
    assert figure["value"] == round((float(launch_s) - training_s) / training_s, 2), figure


def test_nfs_server_restart_mid_run_neither_stops_nor_rewinds_the_job(training):
    restart = training.restart
    assert restart.get("restart_rc") == 0, restart
    # The server went down after the step-10 checkpoint and was back before the job's last one.
    assert 0 < restart["checkpoint_step_at_restart"] <= restart["newest_checkpoint_step_after_restart"] < STEPS
    assert training.training.result.rc == 0, training.training.result.output[-4000:]
    steps = [m["step"] for m in training.training.metrics()]
    # Every step once, in order: the outage neither stopped the job nor sent it back to a checkpoint.
    assert steps == list(range(1, STEPS + 1)), steps


def test_the_outage_held_the_clients_own_writes_to_the_share_until_the_server_was_back(training):
    # Rank 0 runs on the server, which writes the checkpoints and metrics to its own disk. The I/O of the job
    # that crosses the mount is the client's: its node runner rewrites its status file there every 5 s, and
    # records how long its slowest write took. One of them met the outage (it was longer than 5 s), and the
    # hard mount held it until the server answered again, instead of failing it.
    restart = training.restart
    assert training.training.result.rc == 0 and training.training.run_dir, training.training.result.output[-4000:]
    run_id = training.training.run_dir.name
    status_file = f"/data/ddp/{JOB}/runs/{run_id}/nodes/status-{CLIENT}.json"
    status = json.loads(on(CLIENT, f"cat {status_file}").stdout)
    kernel_log = on(CLIENT, "journalctl -k --no-pager | grep -i nfs | tail -5").stdout
    assert status["beat"] == -1 and status["exit_code"] == 0, status
    assert status["slowest_write_s"] >= restart["outage_s"] / 4, (status, restart, kernel_log)


def test_every_checkpoint_on_nfs_survived_the_restart(training):
    assert training.training.result.rc == 0
    # As the job's user: the job's directories are its own (root on the client is squashed by NFS anyway).
    listing = on(CLIENT, f"runuser -u {CLUSTER_USER} -- sh -c 'cd {CHECKPOINTS} && sha256sum -c ckpt-*.sha256'")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    # The smoke config keeps the newest three (checkpoint.keep_last), one every 10 steps, all of them verified.
    kept = [f"ckpt-{step:08d}.pt: OK" for step in (STEPS - 20, STEPS - 10, STEPS)]
    assert listing.stdout.splitlines() == kept, listing.stdout


def test_ran_in_the_training_image_whose_containers_are_gone_afterwards(training):
    assert training.training.result.rc == 0
    for node in NODES:
        # The VMs have no torch of their own: a job that trained there ran inside the image.
        assert on(node, "python3 -c 'import torch'").returncode != 0, f"{node} has torch outside the image"
        left = on(node, "docker ps -aq --filter name=ddp-")
        assert left.returncode == 0 and not left.stdout.strip(), f"{node} still has {left.stdout}"


def test_checkpoint_on_nfs_is_collected_and_its_checksums_verify(training):
    run_dir = training.training.run_dir
    assert training.training.result.rc == 0 and run_dir
    checked = subprocess.run(
        ["sha256sum", "-c", "MANIFEST.sha256"], cwd=run_dir, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [collected] = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    assert collected.name == f"ckpt-{STEPS:08d}.pt"
    # The same file, read through the client's NFS mount.
    on_client = on(CLIENT, f"runuser -u {CLUSTER_USER} -- sha256sum {CHECKPOINTS}/{collected.name}")
    assert on_client.stdout.split()[:1] == [hashlib.sha256(collected.read_bytes()).hexdigest()], on_client.stderr


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Each node's first rank says where its package and its data came from.
OWN_PROGRAM = """import os, ddp_demo_dep
data = os.environ["DDP_DATA_DIR"]
if os.environ["LOCAL_RANK"] == "0":
    print(f"dep {ddp_demo_dep.VALUE} from {ddp_demo_dep.__file__}; data {sorted(os.listdir(data))} in {data}")
"""


def test_a_job_brings_a_package_the_vms_cannot_download_and_a_dataset_staged_on_each(training, tmp_path):
    """The VMs reach no package index: the controller resolves the requirement for them and ships it."""
    assert training.training.result.rc == 0
    code, data = tmp_path / "code", tmp_path / "data"
    code.mkdir()
    data.mkdir()
    (code / "main.py").write_text(OWN_PROGRAM)
    (code / "requirements.txt").write_text("ddp-demo-dep==1.0\n")
    (data / "shard-0.txt").write_text("lab data\n")
    wheels = load("demo_wheels", ROOT / "molecule" / "shared" / "demo_wheels.py").demo_index(tmp_path / "wheels")
    settings = {"train_index_options": ["--no-index", "--find-links", str(wheels)], "train_data_stage": "local"}
    run = train(f"PROGRAM={code}/main.py", "JOB=e2e-own", f"DATA={data}:e2e-own", f"EXTRA_VARS={json.dumps(settings)}")
    output = run.result.output
    assert run.result.rc == 0 and run.run_dir, output[-4000:]
    assert re.search(r"made for this key in \d+\.\d s, adding ddp-demo-dep==1\.0, ddp-demo-leaf==1\.2", output), output[
        -4000:
    ]
    for node in NODES:
        assert f"  [{node}] dataset staged locally: copied 1 of 1 files" in output, output[-4000:]
        log = (run.run_dir / "logs" / node / "node.log").read_text()
        assert "dep 1.0 from /data/ddp/envs/" in log, log[-2000:]
        assert "data ['shard-0.txt'] in " in log and f"/.local/state/ddp-train/{node}/data/e2e-own\n" in log, log
