"""A user's own script through `make train` on inventory/local: shipped with its directory, run from the job's
persistent work dir with exactly its arguments, its outputs collected, and resumed by the next run."""

import hashlib
import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from _make import ROOT, finished_report, make_train, node_log
from _modules import load

TUTORIAL = ROOT / "examples" / "ddp-tutorial"
STAGES = [
    "checking the inventory",
    "checking driver, CUDA and NCCL versions agree",
    "preflight on every node",
    "checking each node: runtime, shared directories, rendezvous port",
    "shipping the working directory to shared storage",
    "starting torchrun on every node",
    "stopping the run everywhere",
    "collecting checkpoints, metrics and logs",
]

pytestmark = pytest.mark.slow


@pytest.fixture
def tutorial(tmp_path):
    """A copy of the example whose sibling module says which version of the code runs."""
    workdir = tmp_path / "tutorial"
    shutil.copytree(TUTORIAL, workdir)

    def change_code(version: str) -> Path:
        text = (TUTORIAL / "model.py").read_text()
        (workdir / "model.py").write_text(f'{text}\nprint("code version {version}", flush=True)\n')
        return workdir

    return change_code


def test_own_script_ships_runs_in_the_shared_work_dir_and_resumes_from_its_snapshot(tutorial, tmp_path):
    job = f"unit-own-{uuid.uuid4().hex[:8]}"
    workdir = tutorial("1")
    # A list through JSON, first; then through @file. main.py's argparse refuses any other argument, so a
    # success also proves that none of train.py's default arguments reached it.
    args = json.dumps({"train_program_args": ["4", "2", "--batch_size", "64"]})
    first, run_id = make_train(f"PROGRAM={workdir}/main.py", f"JOB={job}", f"EXTRA_VARS={args}")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "code version 1" in node_log(run_id)
    # What a user reads: one line per stage (known by its role task file, not by a task title), what was packed,
    # and the outcome read back from run.json.
    assert [line[2:] for line in first.stdout.splitlines() if line.startswith("- ")] == STAGES, first.stdout
    assert re.search(r"^  packed 3 files, [0-9.]+ kB, sha256 [0-9a-f]{12}$", first.stdout, re.MULTILINE), first.stdout
    assert f"  run {run_id}: succeeded\n  no summary.json in the run's DDP_OUTPUT_DIR" in first.stdout, first.stdout

    # The shipped code is the job user's alone: no file or directory of it is open to group or others.
    shipped = ROOT / "runs" / "ddp" / job / "code" / run_id
    modes = {path.name or ".": path.stat().st_mode & 0o077 for path in [shipped, *shipped.rglob("*")]}
    assert modes == dict.fromkeys(modes, 0), modes

    snapshot = ROOT / "runs" / "ddp" / job / "work" / "snapshot.pt"
    assert snapshot.is_file(), "the relative snapshot.pt is not in the job's shared work dir"
    collected = ROOT / "artifacts" / run_id
    assert "  work/snapshot.pt\n" in (collected / "MANIFEST.sha256").read_text()
    check = subprocess.run(["sha256sum", "-c", "MANIFEST.sha256"], cwd=collected, capture_output=True, check=False)
    assert check.returncode == 0, check.stdout
    assert "wrote no metrics" in finished_report(collected)
    code = json.loads((collected / "code.json").read_text())
    assert (code["program"], code["files"]) == ("main.py", 3), code  # main.py, model.py, .ddpignore

    (tmp_path / "args.yml").write_text("train_program_args: ['6', '2']\n")
    second, run_id = make_train(f"PROGRAM={tutorial('2')}/main.py", f"JOB={job}", f"EXTRA_VARS=@{tmp_path}/args.yml")
    assert second.returncode == 0, second.stdout + second.stderr
    log = node_log(run_id)
    assert "code version 2" in log, "the changed code did not run"
    assert "Resuming training from snapshot at epoch 4" in log, log[-2000:]
    assert json.loads((ROOT / "artifacts" / run_id / "code.json").read_text())["sha256"] != code["sha256"]
    shutil.rmtree(ROOT / "runs" / "ddp" / job)


def test_a_misspelt_variable_is_refused_before_any_node_is_contacted():
    done, _ = make_train("EXTRA_VARS=train_step=5")
    assert done.returncode != 0
    assert "train_step: no such variable (did you mean train_steps?)" in done.stdout + done.stderr
    assert "preflight on every node" not in done.stdout


def pack_module():

    return load("pack", "ansible/roles/train/library/ddp_pack_workdir.py")


def test_packing_honours_the_ignore_files_and_hashes_the_content(tmp_path):
    pack = pack_module()
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / "main.py").write_text("print(1)\n")
    (src / "data" / "big.bin").write_bytes(b"x" * 1000)
    (src / "notes.log").write_text("log\n")
    (src / ".git" / "HEAD").write_text("ref\n")
    (src / ".gitignore").write_text("*.log\n")
    (src / ".ddpignore").write_text("data/\n")
    files = pack.list_files(src, [".gitignore", ".ddpignore"])
    assert [str(f) for f in files] == [".ddpignore", ".gitignore", "main.py"]

    first = pack.pack(src, tmp_path / "out", max_bytes=10_000, ignore_files=[".gitignore", ".ddpignore"])
    again = pack.pack(src, tmp_path / "out", max_bytes=10_000, ignore_files=[".gitignore", ".ddpignore"])
    assert (first["changed"], again["changed"], again["sha256"]) == (True, False, first["sha256"])
    (src / "main.py").write_text("print(2)\n")
    changed = pack.pack(src, tmp_path / "out", max_bytes=10_000, ignore_files=[".gitignore", ".ddpignore"])
    assert changed["sha256"] != first["sha256"]
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{hashlib.sha256((src / rel).read_bytes()).hexdigest()}  {rel}\n".encode())
    assert changed["sha256"] == digest.hexdigest()


def test_packing_refuses_a_tree_over_the_limit_naming_its_largest_file(tmp_path):
    pack = pack_module()
    (tmp_path / "weights.bin").write_bytes(b"x" * 5000)
    (tmp_path / "main.py").write_text("pass\n")
    with pytest.raises(pack.WorkdirError, match=r"over the limit .*weights\.bin"):
        pack.pack(tmp_path, tmp_path / "out", max_bytes=1000, ignore_files=[])
    assert not (tmp_path / "out").exists()


def write_tree(src, files):
    """Each relative path of files, created under src with its text."""
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)


def test_an_ignore_file_in_a_subdirectory_applies_only_below_it(tmp_path):
    pack = pack_module()
    write_tree(
        tmp_path, {"secret.env": "a\n", "sub/secret.env": "b\n", "sub/main.py": "\n", "sub/.ddpignore": "secret.env\n"}
    )
    files = pack.list_files(tmp_path, [".gitignore", ".ddpignore"])
    assert [str(f) for f in files] == ["secret.env", "sub/.ddpignore", "sub/main.py"]


def test_an_anchored_pattern_in_a_subdirectory_anchors_at_that_subdirectory(tmp_path):
    pack = pack_module()
    write_tree(tmp_path, {"sub/.gitignore": "/data\n", "sub/data/big.bin": "x\n", "sub/x/data/small.bin": "y\n"})
    files = pack.list_files(tmp_path, [".gitignore", ".ddpignore"])
    assert [str(f) for f in files] == ["sub/.gitignore", "sub/x/data/small.bin"]


def test_a_deeper_negation_re_includes_what_the_root_ignored_but_not_inside_an_ignored_directory(tmp_path):
    pack = pack_module()
    write_tree(
        tmp_path,
        {
            ".gitignore": "*.txt\nbuild/\n",
            "top.txt": "\n",
            "sub/.gitignore": "!keep.txt\n",
            "sub/keep.txt": "\n",
            "sub/other.txt": "\n",
            "sub/build/keep.txt": "\n",
        },
    )
    files = pack.list_files(tmp_path, [".gitignore", ".ddpignore"])
    # The root's *.txt and build/ still apply inside sub/; as in git, sub/build/ being excluded wins over !keep.txt.
    assert [str(f) for f in files] == [".gitignore", "sub/.gitignore", "sub/keep.txt"]
