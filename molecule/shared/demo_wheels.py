"""Tiny pure-python wheels made on the spot, so that tests of a job's requirements need no package index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel of one module (name with '_' for '-') whose VALUE is its version, depending on `requires`."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": f"VALUE = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return path


def demo_index(directory: Path) -> Path:
    """ddp-demo-dep 1.0 (needs ddp-demo-leaf>=1), ddp-demo-leaf 1.2, and ddp-demo-torchy 1.0 (needs torch>=99)."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel(directory, "ddp-demo-dep", "1.0", ("ddp-demo-leaf>=1",))
    wheel(directory, "ddp-demo-leaf", "1.2")
    wheel(directory, "ddp-demo-torchy", "1.0", ("torch>=99",))
    return directory
