"""The adversarial job (molecule/shared/adversary/attack.py) on inventory/local, through `make train`: the launch
runs as root on this machine and the job as a second local account, as on a cluster where Ansible connects as
root. Nothing root does for the run (preflight, polls, collection, a status of an older run) may hand the job what
is not its own. The container tier runs the same job across two hosts (train's two_hosts scenario)."""

import json
import os
import pwd
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from _make import ARTIFACTS, ROOT, make, make_train
from _modules import load

jobs = load("jobs", ROOT / "molecule" / "shared" / "jobs.py")
ATTACK = ROOT / "molecule" / "shared" / "adversary" / "attack.py"
ACCOUNT = "ddp-adversary"
BASE = Path("/var/lib/ddp-adversary")  # root's, 0755: nothing on the way to the job's directories is the job's

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="makes a second local account and runs the launch as root"),
]


def own_venv() -> Path:
    """A venv the second account may run: the project's .venv uses an interpreter under /root (0700), so this one
    uses Debian's python3.11 and reaches the same packages (torch) through a .pth file, read-only."""
    venv = BASE / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run(["/usr/bin/python3.11", "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    # Written each time: another checkout's tests may have pointed it at their own .venv.
    packages = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
    (venv / "lib" / "python3.11" / "site-packages" / "ddp-project.pth").write_text(f"{packages}\n")
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{venv}/bin/python\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    return venv


@pytest.fixture(scope="module")
def second_account(tmp_path_factory) -> Path:
    """An inventory of this machine as a node whose job runs as the second account. Its node is not `localhost`,
    so that the controller's own tasks keep the controller's python while the node's use the node's python3 (the
    controller's lives under /root, which the job's account may not enter). The node directory is the default, in
    the account's home."""
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", ACCOUNT], check=True)
    BASE.mkdir(mode=0o755, exist_ok=True)
    torch = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "torch" / "__init__.py"
    if subprocess.run(["runuser", "-u", ACCOUNT, "--", "test", "-r", str(torch)], check=False).returncode != 0:
        pytest.skip(f"{ACCOUNT} cannot read {torch}: this checkout lies in a directory closed to other accounts")
    shutil.rmtree(BASE / "shared", ignore_errors=True)
    (BASE / "shared").mkdir(mode=0o755)
    shutil.chown(BASE / "shared", ACCOUNT, ACCOUNT)  # as the NFS server's role exports it: the cluster user's
    inventory = tmp_path_factory.mktemp("adversary-inventory")
    node = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "cluster_address": "127.0.0.1",
    }
    hosts = {"all": {"children": {"cluster": {"hosts": {"node0": node}}, "training": {"hosts": {"node0": None}}}}}
    settings = {
        "cluster_user": ACCOUNT,
        "cluster_cidrs": ["127.0.0.0/8"],
        "admin_cidrs": ["127.0.0.0/8"],
        "shared_dir": str(BASE / "shared"),
        "rendezvous_port": 29500,
        "site_refuse": True,
        "train_runtime": "host",
        "train_venv": str(own_venv()),
        "train_code_dir": str(ROOT / "train"),
        "train_config": str(ROOT / "train" / "configs" / "cpu-smoke.yaml"),
        "train_cpu_nproc_per_node": 2,
        "train_artifacts_dir": str(ARTIFACTS),
        "train_env": {"OMP_NUM_THREADS": "1"},
        "train_poll_interval_s": 2,
    }
    (inventory / "hosts.yml").write_text(json.dumps(hosts))
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "all.yml").write_text(json.dumps(settings))
    return inventory


@pytest.fixture
def secret():
    """A file only root may read, in a directory the job may list, so that a link can name it."""
    path = BASE / f"secret-{uuid.uuid4().hex[:8]}"
    token = f"secret-{uuid.uuid4().hex}"
    path.write_text(token + "\n")
    path.chmod(0o600)
    yield path, token
    path.unlink()


def attack(inventory: Path, secret: Path, job: str) -> str:
    done, run_id = make_train(f"INVENTORY={inventory}", f"PROGRAM={ATTACK}", f"ARGS={secret}", f"JOB={job}")
    assert done.returncode == 0 and run_id, done.stdout + done.stderr
    return run_id


def test_a_local_job_of_another_account_reaches_nothing_of_root_s_nor_another_run_s(second_account, secret):
    path, token = secret
    job = f"unit-adversary-{uuid.uuid4().hex[:6]}"
    earlier = attack(second_account, path, job)
    earlier_hashes = jobs.tree_hashes(ARTIFACTS / earlier)
    run_id = attack(second_account, path, job)

    collected = ARTIFACTS / run_id
    reports = [json.loads(report.read_text()) for report in sorted((collected / "work").glob("attempts-*.json"))]
    assert len(reports) == 2, sorted((collected / "work").iterdir())  # both ranks of the one node
    uid = pwd.getpwnam(ACCOUNT).pw_uid
    for attempts in reports:
        assert attempts["uid"] == uid
        jobs.assert_reached_nothing(attempts)
        # The older run's directory is the same account's: writing there is allowed, reaching its artifacts is not.
        assert any(earlier in other for other in attempts["other_runs"]), attempts
    assert list((collected / "work").glob("*leak*")) == []
    check = subprocess.run(["sha256sum", "--quiet", "-c", "MANIFEST.sha256"], cwd=collected, check=False)
    assert check.returncode == 0
    leaked = [found for found in ARTIFACTS.rglob("*") if found.is_file() and token.encode() in found.read_bytes()]
    assert leaked == []
    # Root packed through a child that was the job's user, into a file of root's own, removed once fetched.
    outbox = Path.home() / ".cache" / "ddp-train" / "outbox"
    assert (outbox.stat().st_uid, outbox.stat().st_mode & 0o077) == (0, 0)
    assert [left.name for left in outbox.iterdir() if run_id in left.name] == []

    again = make("status", f"RUN={earlier}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert jobs.tree_hashes(ARTIFACTS / earlier) == earlier_hashes
