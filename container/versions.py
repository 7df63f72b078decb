"""Prints the versions of the training stack in this environment as one JSON object.

Baked into the image (/opt/ddp/versions.py, its output at build time in /opt/ddp/versions.json) and run on
every node by the train_image role, so the cluster's version check sees what each node's image really holds.
Needs no GPU: the CUDA and NCCL versions are the ones torch was built with.
"""

import json
import platform

import torch


def nccl_version() -> str | None:
    if torch.version.cuda is None:
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def cudnn_version() -> str | None:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return None if version is None else str(version)


def main() -> None:
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version(),
        "cudnn": cudnn_version(),
    }
    print(json.dumps(versions, sort_keys=True))


if __name__ == "__main__":
    main()
