"""DATA=dir:name through `make train` on inventory/local: the dataset reaches <shared_dir>/data/<name>/, the
program finds it in DDP_DATA_DIR, and each later launch moves only what changed (deletions on request)."""

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pytest
from _make import ROOT, make_train, node_log, run_record

pytestmark = pytest.mark.slow

# Where inventory/local's node keeps a dataset staged locally (train_data_stage: local): beside its runs.
STAGED = ROOT / "runs" / "node" / "data"

COUNT = """import os, pathlib
data = pathlib.Path(os.environ["DDP_DATA_DIR"])
if os.environ["RANK"] == "0":
    print("dataset holds:", ",".join(sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())),
          "in", data)
"""


@pytest.fixture
def job(tmp_path):
    name = f"unit-data-{uuid.uuid4().hex[:8]}"
    yield name
    shutil.rmtree(ROOT / "runs" / "data" / name, ignore_errors=True)
    shutil.rmtree(STAGED / name, ignore_errors=True)


def listing_sha256(dataset: Path) -> str:
    """The dataset's identity as run.json states it: each file's name, size and whole-second mtime."""
    listing = {
        str(path.relative_to(dataset)): [path.stat().st_size, int(path.stat().st_mtime)]
        for path in dataset.rglob("*")
        if path.is_file()
    }
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def test_a_dataset_syncs_once_then_only_its_changes_and_deletions_on_request(tmp_path, job):
    dataset = tmp_path / "dataset"
    (dataset / "sub").mkdir(parents=True)
    for name, text in (("a.bin", "a" * 1000), ("c.txt", "c"), ("sub/b.txt", "b")):
        (dataset / name).write_text(text)
    program = tmp_path / "code" / "count.py"
    program.parent.mkdir()
    program.write_text(COUNT)
    launch = (f"PROGRAM={program}", f"JOB={job}", f"DATA={dataset}:{job}")

    first, run_id = make_train(*launch)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "- syncing the dataset to shared storage\n" in first.stdout
    assert "  dataset: 3 files, 0.0 MB; sending 3 new or changed (0.0 MB)\n" in first.stdout, first.stdout
    assert "dataset holds: a.bin,c.txt,sub/b.txt" in node_log(run_id)
    assert (ROOT / "runs" / "data" / job / "a.bin").read_text() == "a" * 1000

    # One file changes, one goes: only the change moves, and the gone one stays until deletions are asked for.
    (dataset / "c.txt").write_text("changed")
    (dataset / "a.bin").unlink()
    second, run_id = make_train(*launch)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (
        "  dataset: 2 files, 0.0 MB; sending 1 new or changed (0.0 MB); 1 only on shared storage kept "
        "(train_data_delete: true removes them)\n" in second.stdout
    ), second.stdout
    assert "dataset holds: a.bin,c.txt,sub/b.txt" in node_log(run_id)
    assert (ROOT / "runs" / "data" / job / "c.txt").read_text() == "changed"

    third, run_id = make_train(*launch, f"EXTRA_VARS={json.dumps({'train_data_delete': True})}")
    assert third.returncode == 0, third.stdout + third.stderr
    assert (
        "  dataset: 2 files, 0.0 MB; sending 0 new or changed (0.0 MB), removing 1 the controller no longer has\n"
        in third.stdout
    ), third.stdout
    assert "dataset holds: c.txt,sub/b.txt" in node_log(run_id)
    assert run_record(run_id)["data"] == {
        "dir": str(dataset),
        "path": str(ROOT / "runs" / "data" / job),
        "files": 2,
        "bytes": len("changed") + len("b"),
        "listing_sha256": listing_sha256(dataset),
        "sent_files": 0,
        "sent_bytes": 0,
        "deleted": 1,
        "stale": 0,
    }
    # Nothing of the sync's own is left behind, on either side.
    assert sorted(p.name for p in (ROOT / "runs" / "data" / job).iterdir()) == ["c.txt", "sub"]
    assert not list((ROOT / "artifacts" / ".data").glob("data-*.tar"))

    # Staged: the node copies the shared copy to its own disk and the program reads that; a current copy is kept.
    staged = (*launch, f"EXTRA_VARS={json.dumps({'train_data_stage': 'local'})}")
    fourth, run_id = make_train(*staged)
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    assert "  [localhost] dataset staged locally: copied 2 of 2 files (0.0 MB)\n" in fourth.stdout, fourth.stdout
    assert f"dataset holds: c.txt,sub/b.txt in {STAGED / job}\n" in node_log(run_id)
    (STAGED / job / "leftover").write_text("not in the dataset")
    fifth, run_id = make_train(*staged)
    assert fifth.returncode == 0, fifth.stdout + fifth.stderr
    assert "  [localhost] dataset staged locally: copied 0 of 2 files (0.0 MB), removed 1\n" in fifth.stdout
    sixth, run_id = make_train(*staged)
    assert "  [localhost] dataset staged locally: current (2 files)\n" in sixth.stdout, sixth.stdout
    assert (STAGED / job / "c.txt").read_text() == "changed"


def test_data_that_is_no_directory_is_refused_before_launch(tmp_path):
    done, run_id = make_train(f"DATA={tmp_path}/missing")
    assert done.returncode == 2 and run_id is None
    assert f"make train: DATA={tmp_path}/missing: {tmp_path}/missing is not a directory" in done.stderr
