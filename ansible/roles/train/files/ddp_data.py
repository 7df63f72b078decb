#!/usr/bin/env python3
"""The node's side of a dataset sync, run as the job's user on the master (tasks/sync_data.yml).

    ddp_data.py list DIR     makes DIR (0700) if missing; prints {"kind": "ddp_data.list/1", "files": {path:
                             [size, mtime in whole seconds]}} for every regular file under it (links are skipped)
    ddp_data.py apply DIR    removes the files that DIR/.ddp-sync-delete.json names (the controller no longer has
                             them), then that list; prints {"kind": "ddp_data.apply/1", "deleted": N}

The controller compares the listing with its own tree (size and whole-second mtime, as rsync's quick check)
and sends only what differs, as a tar that keeps each file's mtime. Standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

LIST_REPORT = "ddp_data.list/1"
APPLY_REPORT = "ddp_data.apply/1"
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("list", "apply"):
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(args[1])
    if args[0] == "list":
        print(json.dumps({"kind": LIST_REPORT, "files": listing(directory)}))
    else:
        print(json.dumps({"kind": APPLY_REPORT, "deleted": apply(directory)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
