#!/usr/bin/python
"""Ansible module: pack the user's working directory on the controller for shipping to the nodes."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

DOCUMENTATION = r"""
module: ddp_pack_workdir
short_description: Pack a directory into a content-addressed tar.gz, honouring .gitignore and .ddpignore
description:
  - Lists the files under I(src) that its ignore files do not exclude, and refuses a tree larger than I(max_bytes)
    naming its largest files. As in git, an ignore file in any directory applies below it, with patterns relative
    to that directory, and a deeper file's patterns (C(!) negations included) override shallower ones; a file
    inside an excluded directory cannot be re-included. C(.git/), C(__pycache__/) and C(*.pyc) are always left out.
  - Writes C(<dest_dir>/<sha256>.tar.gz), where the SHA-256 covers every file's relative path and content.
  - With I(runner), also writes the zipapp that ships it, C(<dest_dir>/<sha256>-<runner's sha256[:12]>.pyz): the
    node runner as its C(__main__.py) and the archive as C(code.tar.gz), for C(python3 X.pyz unpack --dest D).
  - Runs on the controller (delegate_to localhost). Needs the pathspec library, a dependency of the toolchain.
options:
  src: {description: Directory to pack., type: path, required: true}
  dest_dir: {description: Directory for the archive., type: path, required: true}
  max_bytes: {description: Largest total size of the packed files., type: int, required: true}
  ignore_files: {description: Names of the ignore files read in every directory of src., type: list, elements: str,
                 default: [.gitignore, .ddpignore]}
  runner: {description: The node runner (ddp_node.py) that unpacks the archive on the node., type: path}
"""

RETURN = r"""
sha256: {description: Content hash of the packed tree., type: str, returned: success}
archive: {description: Path of the tar.gz., type: str, returned: success}
shipper: {description: Path of the zipapp that unpacks it on a node., type: str, returned: when runner is given}
files: {description: Number of files packed., type: int, returned: success}
bytes: {description: Their total size., type: int, returned: success}
"""

ALWAYS_IGNORED = [".git/", "__pycache__/", "*.pyc"]


class WorkdirError(ValueError):
    """The directory cannot be shipped as it is."""


# (directory relative to src, the spec of its ignore files), shallowest first.
Chain = list[tuple[Path, "GitIgnoreSpec"]]


def ignored(always: GitIgnoreSpec, chain: Chain, rel: Path, is_dir: bool) -> bool:
    """Whether rel (relative to src) is left out, by ALWAYS_IGNORED or by the ignore files on its way down."""
    slash = "/" if is_dir else ""  # lets a directory-only pattern (data/) match the directory itself
    # Checked apart from the chain so that no user negation can ship a repository or bytecode.
    if always.match_file(rel.as_posix() + slash):
        return True
    # The deepest file with a matching pattern decides, so that its negations re-include what a parent excluded;
    # check_file reports a negation as include=False rather than as no match, which match_file would hide.
    for base, spec in reversed(chain):
        verdict = spec.check_file(rel.relative_to(base).as_posix() + slash).include
        if verdict is not None:
            return verdict
    return False


def list_files(src: Path, ignore_files: list[str]) -> list[Path]:
    """Relative paths of the files to ship, sorted."""
    from pathspec import GitIgnoreSpec  # imported here so that the module's documentation loads without it

    if not src.is_dir():
        raise WorkdirError(f"{src} is not a directory")
    always = GitIgnoreSpec.from_lines(ALWAYS_IGNORED)
    chains: dict[Path, Chain] = {}
    files = []
    for root, dirs, names in os.walk(src):
        base = Path(root).relative_to(src)
        # Top-down walk: the parent's chain is already known, and this directory's own ignore files extend it.
        chain = list(chains[base.parent]) if base != Path() else []
        # A directory's ignore files act as one, read in the order named, so that a later one's negations win.
        lines = [
            line
            for name in ignore_files
            if (src / base / name).is_file()
            for line in (src / base / name).read_text().splitlines()
        ]
        if lines:
            chain.append((base, GitIgnoreSpec.from_lines(lines)))
        chains[base] = chain
        # Pruning ignored directories keeps a large ignored tree (a dataset, a venv) from being walked at all,
        # and is what makes a file inside an excluded directory impossible to re-include, as in git.
        dirs[:] = sorted(d for d in dirs if not ignored(always, chain, base / d, is_dir=True))
        files += [
            base / n for n in names if (src / base / n).is_file() and not ignored(always, chain, base / n, is_dir=False)
        ]
    return sorted(files)


def content_hash(src: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{hashlib.sha256((src / rel).read_bytes()).hexdigest()}  {rel}\n".encode())
    return digest.hexdigest()


def check_size(src: Path, files: list[Path], max_bytes: int) -> int:
    sizes = {rel: (src / rel).stat().st_size for rel in files}
    total = sum(sizes.values())
    if total > max_bytes:
        largest = sorted(sizes, key=sizes.__getitem__, reverse=True)[:5]
        listed = ", ".join(f"{rel} ({sizes[rel] / 1e6:.1f} MB)" for rel in largest)
        raise WorkdirError(
            f"train_workdir {src} holds {total / 1e6:.1f} MB to ship, over the limit of {max_bytes / 1e6:.1f} MB "
            f"(train_workdir_max_mb). Largest: {listed}. Leave data out with a .ddpignore (gitignore syntax) "
            "and read it from shared storage instead, or raise the limit."
        )
    return total


def pack(src: Path, dest_dir: Path, max_bytes: int, ignore_files: list[str]) -> dict[str, object]:
    files = list_files(src, ignore_files)
    if not files:
        raise WorkdirError(f"train_workdir {src} has no file to ship (all ignored, or empty)")
    total = check_size(src, files, max_bytes)
    sha256 = content_hash(src, files)
    archive = dest_dir / f"{sha256}.tar.gz"
    changed = not archive.exists()
    if changed:
        dest_dir.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: an interrupted run never leaves a truncated archive under the final name.
        with (
            tempfile.NamedTemporaryFile(dir=dest_dir, suffix=".part", delete=False) as part,
            tarfile.open(fileobj=part, mode="w:gz") as tar,
        ):
            for rel in files:
                tar.add(src / rel, arcname=str(rel), recursive=False)
        Path(part.name).replace(archive)
    return {"changed": changed, "sha256": sha256, "archive": str(archive), "files": len(files), "bytes": total}


def zipapp(archive: Path, runner: Path) -> Path:
    """The archive with the runner that unpacks it, one file to ship: archive's name, and the runner's hash."""
    runner_code = runner.read_bytes()
    shipper = archive.with_name(
        f"{archive.name.removesuffix('.tar.gz')}-{hashlib.sha256(runner_code).hexdigest()[:12]}.pyz"
    )
    if not shipper.exists():
        # Stored, not deflated: the archive is compressed already, and the runner is small.
        with (
            tempfile.NamedTemporaryFile(dir=archive.parent, suffix=".part", delete=False) as part,
            zipfile.ZipFile(part, "w", compression=zipfile.ZIP_STORED) as app,
        ):
            app.writestr("__main__.py", runner_code)
            app.write(archive, "code.tar.gz")
        Path(part.name).replace(shipper)
    return shipper


def main() -> None:
    # Imported here: importing ansible patches sys.intern, which breaks torch imported later in the same process
    # (the unit tests import this module's functions beside torch's).
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest_dir": {"type": "path", "required": True},
            "max_bytes": {"type": "int", "required": True},
            "ignore_files": {"type": "list", "elements": "str", "default": [".gitignore", ".ddpignore"]},
            "runner": {"type": "path"},
        },
        supports_check_mode=False,
    )
    params = module.params
    try:
        result = pack(Path(params["src"]), Path(params["dest_dir"]), params["max_bytes"], params["ignore_files"])
        if params["runner"]:
            result["shipper"] = str(zipapp(Path(str(result["archive"])), Path(params["runner"])))
    except (WorkdirError, OSError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
