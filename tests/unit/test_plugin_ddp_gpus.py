"""ddp_gpus, the one GPU detection (docker, gpu_stack, train and the preflight use it), on fake sysfs and /dev."""

import subprocess
import sys
from pathlib import Path

from _modules import ROOT, load

ddp_gpus = load("ddp_gpus", "ansible/plugins/modules/ddp_gpus.py")


def pci_function(root: Path, address: str, vendor: str, device_class: str) -> None:
    (root / address).mkdir(parents=True)
    (root / address / "vendor").write_text(vendor + "\n")
    (root / address / "class").write_text(device_class + "\n")


def test_a_gpu_is_an_nvidia_display_controller_and_nothing_else_on_the_bus(tmp_path):
    pci_function(tmp_path, "0000:b1:00.0", "0x10de", "0x030200")  # 3D controller (data-centre GPUs)
    pci_function(tmp_path, "0000:17:00.0", "0x10de", "0x030000")  # VGA controller
    pci_function(tmp_path, "0000:17:00.1", "0x10de", "0x040300")  # its HDMI audio function
    pci_function(tmp_path, "0000:c1:00.0", "0x10de", "0x068000")  # NVSwitch
    pci_function(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's display controller
    (tmp_path / "0000:00:1f.0").mkdir()  # a function whose files cannot be read
    assert ddp_gpus.pci_gpus(str(tmp_path)) == ["0000:17:00.0", "0000:b1:00.0"]


def test_device_nodes_are_the_numbered_nvidia_nodes_in_numeric_order(tmp_path):
    for name in ("nvidia10", "nvidia2", "nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (tmp_path / name).touch()
    assert ddp_gpus.device_nodes(str(tmp_path)) == [str(tmp_path / n) for n in ("nvidia0", "nvidia2", "nvidia10")]


def test_a_node_without_the_directories_has_no_gpus(tmp_path):
    assert ddp_gpus.pci_gpus(str(tmp_path / "missing")) == []
    assert ddp_gpus.device_nodes(str(tmp_path / "missing")) == []


def test_loading_the_module_leaves_ansible_out_of_the_process():
    """The unit suite loads it beside torch: ansible's module_utils patch sys.intern and break torch._dynamo."""
    probe = (
        "import sys; sys.path.insert(0, 'tests/unit'); from _modules import load; "
        "load('ddp_gpus', 'ansible/plugins/modules/ddp_gpus.py'); "
        "print(sorted(m for m in sys.modules if m.startswith('ansible')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_the_driver_shows_through_an_executable_nvidia_smi_and_the_loaded_module_version(tmp_path):
    smi, version = tmp_path / "nvidia-smi", tmp_path / "version"
    assert not ddp_gpus._executable(str(smi))
    assert ddp_gpus._read(version) == ""  # no module loaded: the check reports "not loaded"
    smi.write_text("#!/bin/sh\n")
    assert not ddp_gpus._executable(str(smi))  # installed but not runnable is not an nvidia-smi to ask
    smi.chmod(0o755)
    version.write_text("550.54.15\n")
    assert ddp_gpus._executable(str(smi))
    assert ddp_gpus._read(version) == "550.54.15"


def test_the_module_reports_every_field_through_ansible(tmp_path):
    """What the roles read, through Ansible itself (in a process of its own, as it runs on a node)."""
    (tmp_path / "nvidia0").touch()
    (tmp_path / "version").write_text("550.54.15\n")
    args = (
        f"pci_devices_path={tmp_path / 'pci'} dev_path={tmp_path} nvidia_smi_path={tmp_path / 'none'} "
        f"module_version_path={tmp_path / 'version'}"
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-M",
            str(ROOT / "ansible/plugins/modules"),
            "-m",
            "ddp_gpus",
            "-a",
            args,
            "-o",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for field in (
        f'"device_nodes": ["{tmp_path}/nvidia0"]',
        '"pci_gpus": []',
        '"nvidia_smi": false',
        '"module_version": "550.54.15"',
    ):
        assert field in done.stdout, done.stdout
