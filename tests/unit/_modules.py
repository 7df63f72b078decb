"""Load a module from a file that is no package's: role plugins, the node runner, scripts (as Ansible does)."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, path: Path | str) -> ModuleType:
    """The module at path (relative to the repository root, or absolute), executed under name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
