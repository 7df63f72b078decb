"""The shipped working directory as one zipapp (ddp_pack_workdir's .pyz): run by the node's python3, its node
runner unpacks the archive beside it into a new directory that is the job's user's alone."""

import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from _modules import ROOT, load

pack_workdir = load("ddp_pack_workdir", "ansible/roles/train/library/ddp_pack_workdir.py")
RUNNER = ROOT / "ansible" / "roles" / "train" / "files" / "ddp_node.py"


def ship(workdir: Path, into: Path) -> Path:
    packed = pack_workdir.pack(workdir, into, 10**6, [".gitignore", ".ddpignore"])
    return pack_workdir.zipapp(Path(packed["archive"]), RUNNER)


def unpack(shipper: Path, dest: Path, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(shipper), "unpack", "--dest", str(dest), *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_code_arrives_with_its_owner_s_modes_only_and_its_links_as_links(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "pkg" / "deep").mkdir(parents=True)
    (workdir / "main.py").write_text("print('hi')\n")
    os.utime(workdir / "main.py", (1_000_000, 1_000_000))  # long before the unpack, so that a kept time shows
    (workdir / "run.sh").write_text("#!/bin/sh\n")
    (workdir / "run.sh").chmod(0o755)
    (workdir / "pkg" / "deep" / "conf.yaml").write_text("a: 1\n")
    (workdir / "pkg" / "deep" / "conf.yaml").chmod(0o644)
    (workdir / "latest.yaml").symlink_to("pkg/deep/conf.yaml")
    shipper = ship(workdir, tmp_path / "code")
    assert shipper.name.endswith(".pyz") and zipfile.ZipFile(shipper).namelist() == ["__main__.py", "code.tar.gz"]

    dest = tmp_path / "shared" / "run-1"
    dest.parent.mkdir()
    done = unpack(shipper, dest, "--program", "main.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"files": 3}'  # the link is made as a link, not counted as a file
    modes = {str(p.relative_to(dest)): stat.S_IMODE(p.lstat().st_mode) for p in [dest, *dest.rglob("*")]}
    del modes["latest.yaml"]  # a link has no mode of its own
    assert modes == {
        ".": 0o700,
        "main.py": 0o600,
        "run.sh": 0o700,
        "pkg": 0o700,
        "pkg/deep": 0o700,
        "pkg/deep/conf.yaml": 0o600,
    }
    assert (dest / "latest.yaml").readlink() == Path("pkg/deep/conf.yaml")
    assert (dest / "pkg" / "deep" / "conf.yaml").read_text() == "a: 1\n"
    assert (dest / "main.py").stat().st_mtime == 1_000_000

    again = unpack(shipper, dest)
    assert again.returncode != 0 and "FileExistsError" in again.stderr  # a run's directory is new, never reused


def test_a_program_the_code_lacks_fails_the_unpack_naming_it(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "main.py").write_text("")
    done = unpack(ship(tmp_path / "work", tmp_path / "code"), tmp_path / "dest", "--program", "train.py")
    assert done.returncode == 1
    assert "the shipped working directory holds no train.py" in done.stderr


def test_a_name_that_leaves_the_directory_is_refused(tmp_path):
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        member = tarfile.TarInfo("../escaped.py")
        tar.addfile(member, io.BytesIO(b""))
    archive = tmp_path / "crafted.tar.gz"
    archive.write_bytes(payload.getvalue())
    done = unpack(pack_workdir.zipapp(archive, RUNNER), tmp_path / "dest")
    assert done.returncode != 0 and "../escaped.py would land outside" in done.stderr
    assert not (tmp_path / "escaped.py").exists()


def test_a_directory_entry_is_made_private_even_when_empty(tmp_path):
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        member = tarfile.TarInfo("outputs/empty")
        member.type, member.mode = tarfile.DIRTYPE, 0o777
        tar.addfile(member)
    archive = tmp_path / "dirs.tar.gz"
    archive.write_bytes(payload.getvalue())
    done = unpack(pack_workdir.zipapp(archive, RUNNER), tmp_path / "dest")
    assert done.returncode == 0, done.stderr
    made = [tmp_path / "dest" / "outputs", tmp_path / "dest" / "outputs" / "empty"]
    assert [stat.S_IMODE(path.stat().st_mode) for path in made] == [0o700, 0o700]
