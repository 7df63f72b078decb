#!/usr/bin/python
"""Ansible module: pack what changed in a dataset directory on the controller, against the node's listing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from pathlib import Path

DOCUMENTATION = r"""
module: ddp_pack_data
short_description: Pack the files of a dataset that the shared copy lacks or holds in another version
description:
  - Compares every regular file under I(src) (size and whole-second mtime, as rsync's quick check) with
    I(remote), the listing of the copy on shared storage (files/ddp_data.py list), and packs those that differ
    into a tar in I(dest_dir), keeping their mtimes so that the next comparison finds them equal.
  - With I(delete), the files the copy holds and I(src) does not are named in the tar's .ddp-sync-delete.json
    (files/ddp_data.py apply removes them); without it they stay and are counted as C(stale).
  - Runs on the controller (delegate_to localhost). Links under I(src) are not followed.
options:
  src: {description: Dataset directory on the controller., type: path, required: true}
  remote: {description: "Listing of the shared copy: path -> [size, mtime].", type: dict, required: true}
  dest_dir: {description: Directory for the tar., type: path, required: true}
  delete: {description: Remove from the copy what src no longer has., type: bool, default: false}
"""

RETURN = r"""
archive: {description: The tar to unpack in the copy, or null when nothing differs., type: str, returned: success}
files: {description: Regular files under src., type: int, returned: success}
bytes: {description: Their total size., type: int, returned: success}
listing_sha256: {description: "sha256 of the listing: names, sizes, whole-second mtimes.", type: str,
                 returned: success}
sent_files: {description: Files packed (new or changed)., type: int, returned: success}
sent_bytes: {description: Their total size., type: int, returned: success}
deleted: {description: Files the copy will lose (delete)., type: int, returned: success}
stale: {description: Files only the copy has, kept (no delete)., type: int, returned: success}
"""

DELETE_LIST = ".ddp-sync-delete.json"


def local_listing(src: Path) -> dict[str, list[int]]:
    if not src.is_dir():
        raise ValueError(f"train_data_dir {src} is not a directory on the controller")
    files: dict[str, list[int]] = {}
    for root, dirs, names in os.walk(src):
        dirs.sort()
        for name in names:
            info = (Path(root) / name).lstat()
            if stat.S_ISREG(info.st_mode):
                files[str((Path(root) / name).relative_to(src))] = [info.st_size, int(info.st_mtime)]
    return files


def pack(src: Path, remote: dict[str, list[int]], dest_dir: Path, delete: bool) -> dict[str, object]:
    local = local_listing(src)
    send = sorted(rel for rel, seen in local.items() if remote.get(rel) != seen)
    gone = sorted(set(remote) - set(local))
    result: dict[str, object] = {
        "files": len(local),
        "bytes": sum(size for size, _ in local.values()),
        # The dataset's identity for run.json: two runs with the same hash read the same names, sizes and mtimes.
        "listing_sha256": hashlib.sha256(json.dumps(local, sort_keys=True).encode()).hexdigest(),
        "sent_files": len(send),
        "sent_bytes": sum(local[rel][0] for rel in send),
        "deleted": len(gone) if delete else 0,
        "stale": 0 if delete else len(gone),
        "archive": None,
    }
    if not send and not result["deleted"]:
        return result
    dest_dir.mkdir(parents=True, exist_ok=True)
    handle, archive = tempfile.mkstemp(dir=dest_dir, prefix="data-", suffix=".tar")
    with os.fdopen(handle, "wb") as file, tarfile.open(fileobj=file, mode="w") as tar:
        for rel in send:
            tar.add(src / rel, arcname=rel, recursive=False)
        if result["deleted"]:
            listed = json.dumps(gone).encode()
            info = tarfile.TarInfo(DELETE_LIST)
            info.size = len(listed)
            tar.addfile(info, io.BytesIO(listed))
    result["archive"] = archive
    return result


def main() -> None:
    # Imported here: importing ansible patches sys.intern, which breaks torch imported later in the same process.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "remote": {"type": "dict", "required": True},
            "dest_dir": {"type": "path", "required": True},
            "delete": {"type": "bool", "default": False},
        },
        supports_check_mode=False,
    )
    params = module.params
    try:
        result = pack(Path(params["src"]), params["remote"], Path(params["dest_dir"]), params["delete"])
    except (ValueError, OSError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=result["archive"] is not None, **result)


if __name__ == "__main__":
    main()
