"""What the controller keeps of a run, in artifacts/<run_id>/: its record, its files and their manifest.

    python -m ddp_launcher.artifacts record RUN_DIR FIELDS_JSON [--code JSON]
        Merges FIELDS_JSON into RUN_DIR/run.json (made, with its version, when absent); atomic. --code (at
        launch): the shipped code's record, written to code.json.
    python -m ddp_launcher.artifacts finish RUN_DIR --outcome JSON
        After collection: unpacks each node's collected/NODE/collected.tar: its log into logs/NODE/, and the master's
        checkpoints/, metrics/ and work/ (regular files and directories only, nothing elsewhere), writes
        MANIFEST.sha256, the outcome and the program's summary into
        run.json, and report.html; prints how the run went.

The train role calls record and finish once each, in the play's own process (its action plugin
ddp_run_artifacts), where they do what a dozen small Ansible tasks did; the command line is for everyone else.
Standard library only, apart from the report's plotting, which loads when it is drawn.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .contract import RUN_RECORD_VERSION

# The run's records, rewritten as its status changes or on request: not among its results (top level only).
RECORDS = frozenset({"MANIFEST.sha256", "run.json", "ansible.log", "report.html", "watch.log"})
# What collected.tar may hold, and how much: the node packs the newest checkpoint (or all), the metrics and at
# most train_collect_work_max_mb of work files, so more means the archive is not the one the node runner wrote.
COLLECTED_DIRS = frozenset({"checkpoints", "metrics", "work"})
COLLECTED_MAX_BYTES = 1 << 40


def write_atomic(path: Path, text: str) -> None:
    """path replaced whole by text, 0644: a reader sees the old file or the new one, never a part."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        out.write(text)
    written = Path(out.name)
    written.chmod(0o644)
    written.replace(path)


def record(run_dir: Path, fields: dict[str, Any], code: dict[str, Any] | None = None) -> dict[str, Any]:
    """run.json with fields merged over what it held; the record's version always current. code (at launch): the
    shipped code's record, written to code.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if code:
        write_atomic(run_dir / "code.json", json.dumps(code, indent=4) + "\n")
    path = run_dir / "run.json"
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update(fields)
    merged["version"] = RUN_RECORD_VERSION
    write_atomic(path, json.dumps(merged, indent=4) + "\n")
    return merged


def unpack_collected(run_dir: Path) -> list[str]:
    """Unpacks each node's collected/NODE/collected.tar into the run's directory, then removes it.

    tarfile's data filter refuses links out, absolute and ../ paths and device files, and drops the node's owner.
    A node's archive may hold its own logs/NODE/ and checkpoints/, metrics/ and work/: anything else (another
    node's log, run.json), or more than COLLECTED_MAX_BYTES in all, is refused.
    """
    unpacked: list[str] = []
    for archive in sorted(run_dir.glob("collected/*/collected.tar")):
        node = archive.parent.name
        allowed = [*sorted(COLLECTED_DIRS), f"logs/{node}"]
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
            strays = [m.name for m in members if not _allowed(m, allowed)]
            if strays:
                raise ValueError(f"{archive} holds {strays[0]}, outside {', '.join(allowed)}: refused")
            if sum(member.size for member in members) > COLLECTED_MAX_BYTES:
                raise ValueError(f"{archive} unpacks to more than {COLLECTED_MAX_BYTES} bytes: refused")
            tar.extractall(run_dir, members=members, filter="data")
        archive.unlink()
        archive.parent.rmdir()
        unpacked += [member.name for member in members if member.isfile()]
    with contextlib.suppress(OSError):  # gone once every archive is unpacked
        (run_dir / "collected").rmdir()
    return unpacked


def _allowed(member: tarfile.TarInfo, tops: list[str]) -> bool:
    """Under one of the tops, or a directory above one (logs/ above logs/NODE)."""
    name = member.name.rstrip("/")
    return any(
        name == top or name.startswith(f"{top}/") or (member.isdir() and top.startswith(f"{name}/")) for top in tops
    )


def _sha256(path: Path) -> str:
    """Streamed: a checkpoint can be larger than the controller's memory."""
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def write_manifest(run_dir: Path) -> list[str]:
    """MANIFEST.sha256 of every collected file (dot files included), in sha256sum -c's format."""
    collected = sorted(
        path.relative_to(run_dir).as_posix()
        for path in run_dir.rglob("*")
        if path.is_file() and not path.is_symlink() and not (path.parent == run_dir and path.name in RECORDS)
    )
    lines = [f"{_sha256(run_dir / name)}  {name}\n" for name in collected]
    write_atomic(run_dir / "MANIFEST.sha256", "".join(lines))
    return collected


def program_summary(run_dir: Path) -> dict[str, Any]:
    """The program's metrics/summary.json (see docs/launching.md), or {} when it wrote none."""
    path = run_dir / "metrics" / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def summary_lines(run_dir: Path, run_record: dict[str, Any]) -> list[str]:
    """How an ended run went, from its run.json and the program's summary; nothing while it runs."""
    if not run_record.get("ended"):
        return []
    status = run_record.get("status")
    failed = f"FAILED on {run_record.get('failed_node')}"
    lines = [f"run {run_dir.name}: " + (failed if status == "failed" else str(status))]
    summary = program_summary(run_dir)
    loss, rate = summary.get("final_loss"), summary.get("mean_samples_per_s")
    if isinstance(loss, int | float) and isinstance(rate, int | float):
        lines.append(
            f"steps {summary.get('first_step')}..{summary.get('last_step')}, final loss {loss:.4f}, "
            f"mean {rate:.0f} samples/s, world size {summary.get('world_size')}"
        )
    else:
        lines.append("no summary.json in the run's DDP_OUTPUT_DIR: the program reports no metrics")
    lines.append(f"artifacts: {run_dir.resolve()} (verify: cd there && sha256sum -c MANIFEST.sha256)")
    return lines


def finish(run_dir: Path, outcome: dict[str, Any]) -> list[str]:
    """Everything the controller does once a run's files are collected; returns the summary lines."""
    unpack_collected(run_dir)
    write_manifest(run_dir)
    summary = program_summary(run_dir)
    ended = record(
        run_dir,
        {
            "status": outcome["status"],
            "failed_node": outcome.get("node"),
            "reason": outcome.get("reason"),
            "exit_code": outcome.get("exit_code"),
            # Naive UTC, as Ansible's now(utc=true) wrote "started": the two are subtracted.
            "ended": datetime.now(UTC).replace(tzinfo=None).isoformat(),
            "last_step": summary.get("last_step"),
            "final_loss": summary.get("final_loss"),
            "samples_per_s": summary.get("mean_samples_per_s"),
        },
    )
    from . import report  # it writes with write_atomic, from this module

    report.write_now_and_draw_later(run_dir)
    return summary_lines(run_dir, ended)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    recorder = sub.add_parser("record")
    recorder.add_argument("run_dir", type=Path)
    recorder.add_argument("fields", type=json.loads)
    recorder.add_argument("--code", type=json.loads)
    finisher = sub.add_parser("finish")
    finisher.add_argument("run_dir", type=Path)
    finisher.add_argument("--outcome", type=json.loads, required=True)
    args = parser.parse_args(argv)
    if args.action == "record":
        record(args.run_dir, args.fields, code=args.code)
        return 0
    for line in finish(args.run_dir, args.outcome):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
