"""What the controller keeps of a run (ansible/ddp_launcher/artifacts.py): the unpacking of what the master
collected, the manifest, and the end of a run as the train role's verdict calls it."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ddp_launcher import artifacts

ROOT = Path(__file__).resolve().parents[2]


def collected(
    run_dir: Path, members: dict[str, bytes], links: dict[str, str] | None = None, node: str = "node0"
) -> None:
    """A node's archive, as the node runner's collect writes it and the play fetches it."""
    (run_dir / "collected" / node).mkdir(parents=True, exist_ok=True)
    with tarfile.open(run_dir / "collected" / node / "collected.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.mode = len(data), 4242, 0o600
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)


def test_the_collected_archive_lands_in_its_three_directories_owned_by_the_controller(tmp_path):
    run_dir = tmp_path / "job-1"
    collected(run_dir, {"checkpoints/ckpt-3.pt": b"c", "metrics/summary.json": b"{}", "work/sub/.hidden": b"w"})
    assert sorted(artifacts.unpack_collected(run_dir)) == [
        "checkpoints/ckpt-3.pt",
        "metrics/summary.json",
        "work/sub/.hidden",
    ]
    assert not (run_dir / "collected").exists()
    written = run_dir / "work/sub/.hidden"
    assert written.read_bytes() == b"w"
    assert written.stat().st_uid == os.getuid()  # not the node's 4242


@pytest.mark.parametrize(
    ("members", "refusal"),
    [
        ({"run.json": b"{}"}, "holds run.json, outside checkpoints, metrics, work, logs/node0"),
        ({"logs/node1/node.log": b"forged"}, "holds logs/node1/node.log, outside"),
        ({"work/../../escape": b"x"}, "outside the destination"),
    ],
)
def test_an_archive_reaching_out_of_its_directories_is_refused(tmp_path, members, refusal):
    run_dir = tmp_path / "job-1"
    collected(run_dir, members)
    with pytest.raises((ValueError, tarfile.TarError), match=refusal):
        artifacts.unpack_collected(run_dir)
    assert not (tmp_path / "escape").exists()


def test_each_node_s_archive_brings_its_own_log(tmp_path):
    run_dir = tmp_path / "job-1"
    collected(run_dir, {"logs/node0/node.log": b"master", "metrics/m.jsonl": b"{}"}, node="node0")
    collected(run_dir, {"logs/node1/node.log": b"peer"}, node="node1")
    assert sorted(artifacts.unpack_collected(run_dir)) == [
        "logs/node0/node.log",
        "logs/node1/node.log",
        "metrics/m.jsonl",
    ]
    assert (run_dir / "logs/node1/node.log").read_bytes() == b"peer"
    assert not (run_dir / "collected").exists()


def test_links_in_the_archive_are_left_out(tmp_path):
    run_dir = tmp_path / "job-1"
    collected(run_dir, {"work/a.txt": b"a"}, links={"work/passwd": "/etc/passwd", "work/up": "../../x"})
    assert artifacts.unpack_collected(run_dir) == ["work/a.txt"]
    assert sorted(p.name for p in (run_dir / "work").iterdir()) == ["a.txt"]


def test_the_manifest_covers_dot_files_and_nested_names_of_records_but_not_the_records(tmp_path):
    run_dir = tmp_path / "job-1"
    for name in ("run.json", "ansible.log", "report.html", "work/.env", "work/run.json", "metrics/m.jsonl"):
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(name)
    assert artifacts.write_manifest(run_dir) == ["metrics/m.jsonl", "work/.env", "work/run.json"]
    check = subprocess.run(
        ["sha256sum", "-c", "MANIFEST.sha256"], cwd=run_dir, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0 and check.stdout.count(": OK") == 3, check.stdout + check.stderr


def test_finish_records_the_outcome_and_the_program_s_summary_and_prints_it(tmp_path):
    run_dir = tmp_path / "job-1"
    artifacts.record(run_dir, {"status": "running", "started": "2026-12-06T01:00:00"})
    summary = {"first_step": 1, "last_step": 60, "final_loss": 0.125, "mean_samples_per_s": 900.4, "world_size": 2}
    collected(run_dir, {"metrics/summary.json": json.dumps(summary).encode()})
    outcome = {"status": "failed", "node": "node1", "reason": "exit code 1"}
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launcher.artifacts", "finish", str(run_dir), "--outcome", json.dumps(outcome)],
        cwd=ROOT / "ansible",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "run job-1: FAILED on node1",
        "steps 1..60, final loss 0.1250, mean 900 samples/s, world size 2",
        f"artifacts: {run_dir.resolve()} (verify: cd there && sha256sum -c MANIFEST.sha256)",
    ]
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["failed_node"], record["reason"]) == ("failed", "node1", "exit code 1")
    assert (record["last_step"], record["final_loss"], record["samples_per_s"]) == (60, 0.125, 900.4)
    assert record["ended"] > record["started"]
    assert (run_dir / "report.html").stat().st_size > 0
    assert "metrics/summary.json" in (run_dir / "MANIFEST.sha256").read_text()
