"""The GPU stage refuses versions that are not exact before any node changes, naming the variable and the node.

Runs ansible/playbooks/gpu.yml against this machine (connection local) in check mode, so a broken check could
not install anything here either.
"""

from collections.abc import Callable
from pathlib import Path

import yaml
from _playbooks import LOCAL_HOST, PlaybookRun, write_inventory

GOOD = {
    "gpu_stack_driver_version": "535.216.03-2~bpo12+1",
    "gpu_stack_cuda_version": "12.4.127~12.4.1-2",
    "gpu_stack_nccl_version": "2.22.3-1-1",
}
# The task file that runs first after the checks; none of its tasks may start.
FIRST_FILE_AFTER_CHECKS = "gpu_stack/tasks/settings.yml"


def run_checks(
    playbook: Callable[..., PlaybookRun], tmp_path: Path, play: Path | str, host_vars: dict[str, dict]
) -> PlaybookRun:
    """The play in check mode on one local host per entry of host_vars (GOOD versions with its overrides)."""
    hosts = {name: {**LOCAL_HOST, **GOOD, **overrides} for name, overrides in host_vars.items()}
    return playbook(play, write_inventory(tmp_path / "inventory", hosts, {"cluster": hosts}), "--check")


def assert_nothing_ran_after_the_checks(run: PlaybookRun) -> None:
    assert not run.started_any_of(FIRST_FILE_AFTER_CHECKS), sorted(run.started_task_files())
    assert not run.changed_results(), run.output[-2000:]


BAD = {
    "driver-major-only": {"gpu_stack_driver_version": "535"},
    "driver-wildcard": {"gpu_stack_driver_version": "535.*"},
    "driver-empty": {"gpu_stack_driver_version": ""},
    "cuda-latest": {"gpu_stack_cuda_version": "latest"},
    "nccl-range": {"gpu_stack_nccl_version": ">=2.0"},
    "nccl-no-revision": {"gpu_stack_nccl_version": "2.22.3"},
}


def test_inexact_versions_refused_on_every_node_before_any_change(tmp_path, playbook):
    # One node per bad value, plus a node whose values are all good: it must not be changed either.
    run = run_checks(playbook, tmp_path, "ansible/playbooks/gpu.yml", {**BAD, "all-good": {}})
    output = run.output
    assert run.rc != 0, output[-2000:]
    for node, overrides in BAD.items():
        ((variable, value),) = overrides.items()
        assert f"host {node}: {variable}='{value}'" in output, output[-3000:]
    assert "host all-good:" not in output
    assert_nothing_ran_after_the_checks(run)


def test_unknown_source_and_component_refused_by_the_argument_specs(tmp_path, playbook):
    bad = {
        "bad-source": {"gpu_stack_source": "ppa"},
        "bad-component": {"gpu_stack_components": ["driver", "cudnn"]},
    }
    run = run_checks(playbook, tmp_path, "ansible/playbooks/gpu.yml", bad)
    output = run.output
    assert run.rc != 0, output[-2000:]
    assert "gpu_stack_source" in output and "ppa" in output, output[-3000:]
    assert "gpu_stack_components" in output and "cudnn" in output, output[-3000:]
    assert_nothing_ran_after_the_checks(run)


def test_exact_versions_as_apt_prints_them_pass(tmp_path, playbook):
    play = tmp_path / "validate_only.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Only the version checks",
                    "hosts": "cluster",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Check the versions",
                            "ansible.builtin.include_role": {"name": "gpu_stack", "tasks_from": "validate.yml"},
                        }
                    ],
                }
            ]
        )
    )
    exact = {
        "debian-backports": {},
        "debian-stable": {"gpu_stack_driver_version": "535.261.03-1"},
        "nvidia-repo": {
            "gpu_stack_driver_version": "550.54.15-1",
            "gpu_stack_cuda_version": "12.4.127-1",
            "gpu_stack_nccl_version": "2.21.5-1+cuda12.4",
        },
        "ubuntu-epoch": {"gpu_stack_driver_version": "1:550.54.15-0ubuntu1"},
    }
    run = run_checks(playbook, tmp_path, play, exact)
    assert run.rc == 0, run.output[-3000:]
