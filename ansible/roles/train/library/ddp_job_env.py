#!/usr/bin/python
"""Ansible module: the job's Python environment, made on the controller: its key, and on a miss the environment."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

DOCUMENTATION = r"""
module: ddp_job_env
short_description: Key a job's requirements to its runtime, and make the environment for the nodes
description:
  - The key is a hash of the requirements file, the runtime's identity (the image ID, or the venv's python and
    torch versions and the node's platform) and the installer (uv's version and I(index_options)).
  - With I(base) (what the runtime's environment holds: python, machine, glibc, dists), it refuses a requirement
    that would replace a pinned package of the runtime (PROTECTED), resolves the rest with uv for the nodes'
    python and platform, every package of the runtime pinned as it is, installs what the runtime lacks into
    I(cache_dir)/KEY/site-packages (kept: another cluster with the same key installs nothing) and packs it into
    I(cache_dir)/KEY/site-packages.tar, which the master unpacks. The nodes need no package index and no installer.
  - Runs on the controller (delegate_to localhost).
options:
  requirements: {description: The requirements file., type: path, required: true}
  identity: {description: The runtime's identity., type: dict, required: true}
  base: {description: The runtime's environment (files/ddp_env.py base); without it only the key is computed.,
         type: dict}
  cache_dir: {description: Where environments are kept per key., type: path, required: true}
  index_options: {description: "uv's (and pip's) index options: --index-url URL, --extra-index-url URL,
                   --find-links DIR, --no-index.", type: list, elements: str, default: []}
"""

RETURN = r"""
key: {description: The environment's key (sha256, 24 hex digits)., type: str, returned: success}
packages: {description: "name==version of each package the environment adds to the runtime's.", type: list,
           returned: with base}
archive: {description: The environment's site-packages as a tar, for the master., type: str, returned: with base}
bytes: {description: "The tar's size: about what the environment takes on shared storage.", type: int,
        returned: with base}
"""

# A job may not replace these: the cluster pins them identically on every node, with CUDA and NCCL.
PROTECTED = re.compile(r"(torch|torchvision|torchaudio|triton|numpy|nvidia-.*)")
# name==version of each package the environment adds, beside its site-packages (the placed copy has it too).
PACKAGES_FILE = "packages.json"
# The platforms uv can target (x86_64-manylinux_2_17 ... _2_40).
MANYLINUX_MINOR = (17, 40)


class EnvError(ValueError):
    """The requirements cannot make an environment on this runtime; the message says why in one line."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uv(*argv: str) -> subprocess.CompletedProcess[str]:
    from uv import find_uv_bin  # the toolchain's own uv (requirements.txt); imported here, as ansible is

    # --native-tls: the system's CA bundle, which a site's proxy may need.
    command = [find_uv_bin(), *argv, "--native-tls", "--quiet"]
    return subprocess.run(command, capture_output=True, text=True, check=False, env=os.environ | {"NO_COLOR": "1"})


def uv_version() -> str:
    from importlib.metadata import version

    return version("uv")


def env_key(requirements: Path, identity: dict[str, object], index_options: list[str]) -> str:
    spec = {
        "requirements": requirements.read_text(),
        "runtime": identity,
        "installer": f"uv {uv_version()}",
        "index_options": index_options,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def protected_conflicts(requirements: Path, pins: dict[str, str]) -> list[str]:
    """One sentence per requirement that asks for a protected package in a version other than the pinned one:
    said plainly here, before the resolver's account of the same conflict."""
    from packaging.requirements import InvalidRequirement, Requirement

    found = []
    for number, line in enumerate(requirements.read_text().splitlines(), 1):
        text = line.split(" #", 1)[0].strip()
        if not text or text.startswith(("#", "-")):
            continue
        try:
            wanted = Requirement(text)
        except InvalidRequirement as error:
            # packaging's message goes on to draw the line with a caret under the fault: its first line is enough.
            why = str(error).splitlines()[0]
            raise EnvError(f"{requirements.name} line {number}: {text!r} is not a requirement ({why})") from None
        name = canonical(wanted.name)
        pinned = pins.get(name)
        if PROTECTED.fullmatch(name) and pinned and not wanted.specifier.contains(pinned, prereleases=True):
            found.append(
                f"{requirements.name} line {number} asks for {text}, but the runtime pins {name} {pinned}: a job "
                f"cannot replace, upgrade or downgrade it (the cluster keeps it identical on every node). Drop the "
                f"line or ask for {name}=={pinned}."
            )
    return found


def node_target(base: dict[str, object]) -> list[str]:
    """uv's options for the nodes' python and platform (manylinux up to their glibc, within what uv knows)."""
    major, minor = (int(part) for part in str(base["glibc"]).split(".")[:2])
    minor = min(max(minor, MANYLINUX_MINOR[0]), MANYLINUX_MINOR[1])
    python = ".".join(str(base["python"]).split(".")[:2])
    return ["--python-version", python, "--python-platform", f"{base['machine']}-manylinux_{major}_{minor}"]


def stub_wheels(pins: dict[str, str], directory: Path) -> None:
    """A wheel of metadata alone for each package of the runtime: the resolver takes them as they are (a torch
    built for CUDA is on no index), and whatever needs another version of one of them cannot be resolved."""
    directory.mkdir()
    for name, version in pins.items():
        dist = re.sub(r"[-.]+", "_", name)
        info = f"{dist}-{version}.dist-info"
        with zipfile.ZipFile(directory / f"{dist}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            wheel.writestr(
                f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: ddp\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            wheel.writestr(f"{info}/RECORD", "")


def refusal(done: subprocess.CompletedProcess[str], pins: dict[str, str]) -> str:
    """uv's refusal in one line: its first cause, and the runtime's pins it ran into."""
    said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    cause = None
    if any(line.startswith("cause: ") for line in said):
        # Its first sentence, which uv may have wrapped over several lines.
        start = next(i for i, line in enumerate(said) if line.startswith("cause: "))
        rest = said[start + 1 :]
        until = next((i for i, line in enumerate(rest) if line.startswith(("And because", "hint:"))), len(rest))
        cause = " ".join([said[start].removeprefix("cause: "), *rest[:until]])
    text = cause or next((line.removeprefix("error: ") for line in said if line.startswith("error: ")), "")
    text = text or (said[-1] if said else f"uv exited {done.returncode}")
    pinned = sorted(name for name in pins if PROTECTED.fullmatch(name) and re.search(rf"\b{re.escape(name)}==", text))
    if pinned:
        text += " (the runtime pins " + ", ".join(f"{name} {pins[name]}" for name in pinned) + ")"
    return text


def resolve(requirements: Path, base: dict[str, object], index_options: list[str], work: Path) -> list[str]:
    """name==version of each package the environment needs beyond the runtime's own, for the nodes."""
    pins = {canonical(name): str(version) for name, version in dict(base["dists"]).items()}  # type: ignore[call-overload]
    constraints = work / "runtime-pins.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    stub_wheels(pins, work / "runtime")
    compiled = work / "resolved.txt"
    done = uv("pip", "compile", str(requirements), "-c", str(constraints), "--find-links", str(work / "runtime"),
              *node_target(base), *index_options, "--no-header", "--no-annotate", "-o", str(compiled))  # fmt: skip
    if done.returncode != 0:
        raise EnvError(f"{requirements.name} cannot be resolved for the nodes: {refusal(done, pins)}")
    chosen = dict(
        line.split("==", 1) for line in compiled.read_text().splitlines() if "==" in line and line[:1].isalnum()
    )
    return sorted(f"{name}=={version}" for name, version in chosen.items() if pins.get(canonical(name)) != version)


def install(packages: list[str], base: dict[str, object], index_options: list[str], target: Path) -> None:
    done = uv("pip", "install", "--no-deps", "--target", str(target), *node_target(base), *index_options, *packages)
    if done.returncode != 0:
        raise EnvError(f"the environment cannot be installed: {refusal(done, {})}")


def make(params: dict[str, object]) -> dict[str, object]:
    requirements = Path(str(params["requirements"]))
    index_options = list(params["index_options"])  # type: ignore[call-overload]
    key = env_key(requirements, dict(params["identity"]), index_options)  # type: ignore[call-overload]
    base = params.get("base")
    if not base:
        return {"key": key}
    conflicts = protected_conflicts(requirements, {canonical(k): v for k, v in dict(base["dists"]).items()})  # type: ignore[index]
    if conflicts:
        raise EnvError(" ".join(conflicts))
    kept = Path(str(params["cache_dir"])) / key
    listed = kept / PACKAGES_FILE
    kept.parent.mkdir(parents=True, exist_ok=True)
    with (kept.parent / f".{key}.lock").open("w") as lock:
        # Two launches of one key at once: the second waits here, then finds the first's.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not listed.is_file():
            make_kept(requirements, base, index_options, kept)  # type: ignore[arg-type]
    archive = kept / "site-packages.tar"
    return {
        "key": key,
        "packages": json.loads(listed.read_text()),
        "archive": str(archive),
        "bytes": archive.stat().st_size,
    }


def make_kept(requirements: Path, base: dict[str, object], index_options: list[str], kept: Path) -> None:
    """The environment's packages, resolved and installed for the nodes, kept in kept/ and packed for them. Made
    once per key on this controller; a half-made one has no packages.json and is made again."""
    listed = kept / PACKAGES_FILE
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        packages = resolve(requirements, base, index_options, Path(work))  # type: ignore[arg-type]
    (kept / "site-packages").mkdir()
    if packages:
        install(packages, base, index_options, kept / "site-packages")  # type: ignore[arg-type]
    listing = (json.dumps(packages) + "\n").encode()
    with tarfile.open(kept / "site-packages.tar", "w") as tar:
        tar.add(kept / "site-packages", arcname="site-packages")
        info = tarfile.TarInfo(PACKAGES_FILE)  # the placed environment says what it holds, for later runs
        info.size = len(listing)
        tar.addfile(info, io.BytesIO(listing))
    listed.write_bytes(listing)


def main() -> None:
    # Imported here: importing ansible patches sys.intern, which breaks torch imported later in the same process.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "requirements": {"type": "path", "required": True},
            "identity": {"type": "dict", "required": True},
            "base": {"type": "dict"},
            "cache_dir": {"type": "path", "required": True},
            "index_options": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=False,
    )
    try:
        result = make(module.params)
    except (EnvError, OSError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
