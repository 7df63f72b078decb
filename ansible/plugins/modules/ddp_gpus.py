#!/usr/bin/python
"""Ansible module ddp_gpus: the one place a node's NVIDIA GPUs are detected (docker, gpu_stack, train, preflight)."""

from __future__ import annotations

import os
import re
from pathlib import Path

DOCUMENTATION = r"""
module: ddp_gpus
short_description: List a node's NVIDIA GPUs, on PCI and as driver device nodes
description:
  - A GPU on PCI is an NVIDIA function (vendor 0x10de) of the display controller class 0x03xxxx; NVIDIA's HDMI
    audio functions (0x0403xx) and NVSwitches (0x0680xx) do not count. Read from sysfs, so nodes need no
    pciutils, and true whether or not a driver is loaded (the GPU stage may not have run yet).
  - A usable GPU is a device node /dev/nvidiaN, which exists once the driver is loaded.
  - Also reports what the running driver shows without running anything: whether nvidia-smi is installed and
    the loaded kernel module's version (the GPU stack's consistency check compares them across nodes).
  - Reads only; never changes the node.
options:
  pci_devices_path:
    description: Directory of PCI functions (tests point it at a fake tree).
    type: path
    default: /sys/bus/pci/devices
  dev_path:
    description: Directory of device nodes (tests point it at a fake tree).
    type: path
    default: /dev
  nvidia_smi_path:
    description: Where nvidia-smi is installed.
    type: path
    default: /usr/bin/nvidia-smi
  module_version_path:
    description: The loaded nvidia kernel module's version file.
    type: path
    default: /sys/module/nvidia/version
"""

RETURN = r"""
pci_gpus:
  description: PCI addresses of the NVIDIA GPUs, sorted.
  type: list
  elements: str
  returned: always
device_nodes:
  description: The /dev/nvidiaN device nodes, in N order.
  type: list
  elements: str
  returned: always
nvidia_smi:
  description: Whether nvidia-smi is installed (nvidia_smi_path is an executable file).
  type: bool
  returned: always
module_version:
  description: The loaded nvidia kernel module's version; empty when none is loaded.
  type: str
  returned: always
"""

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS = re.compile(r"^0x03[0-9a-f]{4}$", re.IGNORECASE)
DEVICE_NODE = re.compile(r"^nvidia([0-9]+)$")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""


def pci_gpus(pci_devices_path: str) -> list[str]:
    root = Path(pci_devices_path)
    if not root.is_dir():
        return []
    return sorted(
        function.name
        for function in root.iterdir()
        if _read(function / "vendor").lower() == NVIDIA_VENDOR and DISPLAY_CLASS.match(_read(function / "class"))
    )


def device_nodes(dev_path: str) -> list[str]:
    root = Path(dev_path)
    if not root.is_dir():
        return []
    numbered = [(int(m.group(1)), node) for node in root.iterdir() if (m := DEVICE_NODE.match(node.name))]
    return [str(node) for _, node in sorted(numbered)]


def _executable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


def main() -> None:
    # Imported here, not at the top: the unit tests load this file in-process beside torch, and importing
    # ansible's module_utils patches sys.intern, which breaks torch._dynamo for every later test.
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "pci_devices_path": {"type": "path", "default": "/sys/bus/pci/devices"},
            "dev_path": {"type": "path", "default": "/dev"},
            "nvidia_smi_path": {"type": "path", "default": "/usr/bin/nvidia-smi"},
            "module_version_path": {"type": "path", "default": "/sys/module/nvidia/version"},
        },
        supports_check_mode=True,
    )
    module.exit_json(
        changed=False,
        pci_gpus=pci_gpus(module.params["pci_devices_path"]),
        device_nodes=device_nodes(module.params["dev_path"]),
        nvidia_smi=_executable(module.params["nvidia_smi_path"]),
        module_version=_read(Path(module.params["module_version_path"])),
    )


if __name__ == "__main__":
    main()
