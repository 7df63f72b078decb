#!/usr/bin/env python3
"""The node's side of a dataset sync, run as the job's user (tasks/sync_data.yml): list and apply on the master,
stage on every node.

    ddp_data.py list DIR     makes DIR (0700) if missing; prints {"kind": "ddp_data.list/1", "files": {path:
                             [size, mtime in whole seconds]}} for every regular file under it (links are skipped)
    ddp_data.py apply DIR    removes the files that DIR/.ddp-sync-delete.json names (the controller no longer has
                             them), then that list; prints {"kind": "ddp_data.apply/1", "deleted": N}
    ddp_data.py stage SHARED LOCAL
                             on every node (train_data_stage: local): makes LOCAL the same as SHARED, copying only
                             new and changed files and removing the rest; prints {"kind": "ddp_data.stage/1",
                             "files", "bytes", "copied_files", "copied_bytes", "removed"}; a current copy costs
                             two listings

The controller compares the listing with its own tree (size and whole-second mtime, as rsync's quick check)
and sends only what differs, as a tar that keeps each file's mtime. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

LIST_REPORT = "ddp_data.list/1"
APPLY_REPORT = "ddp_data.apply/1"
STAGE_REPORT = "ddp_data.stage/1"
DELETE_LIST = ".ddp-sync-delete.json"


def listing(directory: Path) -> dict[str, list[int]]:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files: dict[str, list[int]] = {}
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in names:
            path = Path(root) / name
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                files[str(path.relative_to(directory))] = [info.st_size, int(info.st_mtime)]
    files.pop(DELETE_LIST, None)
    return files


def apply(directory: Path) -> int:
    """Removes the listed files, each only if it lies inside directory and is no link: the list came from the
    controller, but the tree is the job's."""
    listed = directory / DELETE_LIST
    if not listed.is_file():
        return 0
    deleted = 0
    root = directory.resolve()
    for rel in json.loads(listed.read_text()):
        path = directory / rel
        if path.is_symlink() or not path.resolve().is_relative_to(root) or not path.is_file():
            continue
        path.unlink()
        deleted += 1
    listed.unlink()
    return deleted


def stage(shared: Path, local: Path) -> dict[str, object]:
    """Copies what differs (size and whole-second mtime) from the shared copy to this node's, each file under a
    temporary name renamed into place, so a staging cut short leaves no half-copied file that looks current."""
    wanted, held = listing(shared), listing(local)
    copy = sorted(rel for rel, seen in wanted.items() if held.get(rel) != seen)
    for rel in copy:
        target = local / rel
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".staging-")
        os.close(handle)
        shutil.copy2(shared / rel, temporary)  # keeps the mtime: the next staging finds the file current
        Path(temporary).replace(target)
    gone = sorted(set(held) - set(wanted))
    for rel in gone:
        (local / rel).unlink()
    return {
        "kind": STAGE_REPORT,
        "files": len(wanted),
        "bytes": sum(size for size, _ in wanted.values()),
        "copied_files": len(copy),
        "copied_bytes": sum(wanted[rel][0] for rel in copy),
        "removed": len(gone),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not ((len(args) == 2 and args[0] in ("list", "apply")) or (len(args) == 3 and args[0] == "stage")):
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(args[1])
    if args[0] == "list":
        print(json.dumps({"kind": LIST_REPORT, "files": listing(directory)}))
    elif args[0] == "apply":
        print(json.dumps({"kind": APPLY_REPORT, "deleted": apply(directory)}))
    else:
        print(json.dumps(stage(directory, Path(args[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
