"""Lets the gpu_stack scenarios' tests (one directory per verify step) import their shared helpers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
