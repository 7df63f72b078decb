"""The GPU stage refuses versions that are not exact before any node changes, naming the variable and the node.

Runs ansible/playbooks/gpu.yml against this machine (connection local) in check mode, so a broken check could
not install anything here either.
"""

from pathlib import Path

import ansible_runner
import yaml

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "gpu_stack_driver_version": "535.216.03-2~bpo12+1",
    "gpu_stack_cuda_version": "12.4.127~12.4.1-2",
    "gpu_stack_nccl_version": "2.22.3-1-1",
}
# The task that would run first after the checks; it must never start.
FIRST_TASK_AFTER_CHECKS = "Work out this node's package sets"


def run_playbook(tmp_path: Path, playbook: Path, host_vars: dict[str, dict]) -> tuple[ansible_runner.Runner, str]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    hosts = {name: {**local, **GOOD, **overrides} for name, overrides in host_vars.items()}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": {"hosts": hosts}}}}))
    private_dir = tmp_path / "runner"
    private_dir.mkdir()
    run = ansible_runner.run(
        private_data_dir=str(private_dir),
        playbook=str(playbook),
        inventory=str(inventory),
        cmdline="--check",
        envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "ansible/roles")},
        quiet=True,
    )
    return run, run.stdout.read()


def assert_nothing_ran_after_the_checks(run: ansible_runner.Runner, output: str) -> None:
    started = {e["event_data"].get("task") for e in run.events if e["event"] == "playbook_on_task_start"}
    assert FIRST_TASK_AFTER_CHECKS not in started, sorted(started)
    changed = [e for e in run.events if e["event"] == "runner_on_ok" and e["event_data"]["res"].get("changed")]
    assert not changed, output[-2000:]


BAD = {
    "driver-major-only": {"gpu_stack_driver_version": "535"},
    "driver-wildcard": {"gpu_stack_driver_version": "535.*"},
    "driver-empty": {"gpu_stack_driver_version": ""},
    "cuda-latest": {"gpu_stack_cuda_version": "latest"},
    "nccl-range": {"gpu_stack_nccl_version": ">=2.0"},
    "nccl-no-revision": {"gpu_stack_nccl_version": "2.22.3"},
}


def test_inexact_versions_refused_on_every_node_before_any_change(tmp_path):
    # One node per bad value, plus a node whose values are all good: it must not be changed either.
    run, output = run_playbook(tmp_path, ROOT / "ansible/playbooks/gpu.yml", {**BAD, "all-good": {}})
    assert run.rc != 0, output[-2000:]
    for node, overrides in BAD.items():
        ((variable, value),) = overrides.items()
        assert f"host {node}: {variable}='{value}'" in output, output[-3000:]
    assert "host all-good:" not in output
    assert_nothing_ran_after_the_checks(run, output)


def test_unknown_source_and_component_refused_by_the_argument_specs(tmp_path):
    bad = {
        "bad-source": {"gpu_stack_source": "ppa"},
        "bad-component": {"gpu_stack_components": ["driver", "cudnn"]},
    }
    run, output = run_playbook(tmp_path, ROOT / "ansible/playbooks/gpu.yml", bad)
    assert run.rc != 0, output[-2000:]
    assert "gpu_stack_source" in output and "ppa" in output, output[-3000:]
    assert "gpu_stack_components" in output and "cudnn" in output, output[-3000:]
    assert_nothing_ran_after_the_checks(run, output)


def test_exact_versions_as_apt_prints_them_pass(tmp_path):
    playbook = tmp_path / "validate_only.yml"
    playbook.write_text(
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
    run, output = run_playbook(tmp_path, playbook, exact)
    assert run.rc == 0, output[-3000:]
