"""The job's own requirements through `make train` on inventory/local: an environment on shared storage, built
once per key from wheels the controller resolved for the nodes, reused by the next run, and a requirement that
would replace the runtime's torch refused before anything is shipped. Offline: the wheels are made here and
found through train_index_options, as a site without a package index would set it."""

import json
import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _make import ROOT, make, make_train, node_log, run_record
from _modules import load

ddp_job_env = load("ddp_job_env", ROOT / "ansible/roles/train/library/ddp_job_env.py")
demo_wheels = load("demo_wheels", ROOT / "molecule/shared/demo_wheels.py")

PROGRAM = """import os, ddp_demo_dep, torch
if os.environ["RANK"] == "0":
    print("dep says", ddp_demo_dep.VALUE, "from", ddp_demo_dep.__file__, "with torch", torch.__version__)
"""


@pytest.fixture
def index(tmp_path) -> Path:
    return demo_wheels.demo_index(tmp_path / "wheels")


def launch(tmp_path: Path, index: Path, requirements: str) -> tuple:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "main.py").write_text(PROGRAM)
    # A comment of its own: this test's key is new whatever earlier runs left on shared storage.
    (code / "requirements.txt").write_text(f"# {uuid.uuid4().hex}\n{requirements}\n")
    offline = {"train_index_options": ["--no-index", "--find-links", str(index)]}
    return make_train(f"PROGRAM={code}/main.py", "JOB=unit-env", f"EXTRA_VARS={json.dumps(offline)}")


@pytest.mark.slow
def test_requirements_make_an_environment_once_and_the_next_run_reuses_it(tmp_path, index):
    first, run_id = launch(tmp_path, index, "ddp-demo-dep==1.0")
    assert first.returncode == 0, first.stdout + first.stderr
    built = [line for line in first.stdout.splitlines() if line.startswith("  environment ")]
    assert len(built) == 1 and built[0].endswith("adding ddp-demo-dep==1.0, ddp-demo-leaf==1.2"), first.stdout
    assert re.search(r": made for this key in \d+\.\d s, adding", built[0]), built[0]
    key = built[0].split()[1].rstrip(":")
    import torch

    log = node_log(run_id)
    assert f"dep says 1.0 from {ROOT}/runs/ddp/envs/{key}" in log, log
    assert f"with torch {torch.__version__}" in log  # the runtime's own, untouched
    record = run_record(run_id)["env"]
    assert record["key"].startswith(key) and record["requirements"] == str(tmp_path / "code" / "requirements.txt")
    assert record["packages"] == ["ddp-demo-dep==1.0", "ddp-demo-leaf==1.2"]

    (tmp_path / "code" / "main.py").write_text(PROGRAM + "# a code change keeps the environment\n")
    requirements = (tmp_path / "code" / "requirements.txt").read_text()
    second, run_id = make_train(
        f"PROGRAM={tmp_path}/code/main.py",
        "JOB=unit-env",
        f"EXTRA_VARS={json.dumps({'train_index_options': ['--no-index', '--find-links', str(index)]})}",
    )
    assert (tmp_path / "code" / "requirements.txt").read_text() == requirements
    assert second.returncode == 0, second.stdout + second.stderr
    # The hit's cost to the launch is shown: keying the requirements and finding the environment.
    reused = re.search(rf"^  environment {key}: reused from shared storage, (\d+\.\d) s$", second.stdout, re.M)
    assert reused and 0 < float(reused.group(1)) < 5, second.stdout
    assert "dep says 1.0" in node_log(run_id)
    # A hit records what the environment holds as a miss does, and the run's views show it.
    assert run_record(run_id)["env"]["packages"] == ["ddp-demo-dep==1.0", "ddp-demo-leaf==1.2"]
    listed = make("runs").stdout
    assert any(
        line.startswith(run_id) and f"  {run_record(run_id)['env']['key'][:12]}  " in line
        for line in listed.splitlines()
    ), listed
    report = (ROOT / "artifacts" / run_id / "report.html").read_text()
    assert "<h2>Job environment</h2>" in report and "ddp-demo-dep==1.0\nddp-demo-leaf==1.2" in report


# What the refusal says, in one line: the requirement, and the runtime's pin where it is the reason.
REFUSED = {
    "asks for another torch": (
        "torch>=99",
        ["requirements.txt line 2 asks for torch>=99, but the runtime pins torch {torch}: a job cannot replace"],
    ),
    "depends on another torch": (
        "ddp-demo-torchy",
        [
            "requirements.txt cannot be resolved for the nodes: Because all versions of ddp-demo-torchy depend on "
            "torch>=99",
            "cannot be used. (the runtime pins torch {torch})",
        ],
    ),
    "cannot be found": (
        "ddp-demo-missing==3",
        ["requirements.txt cannot be resolved for the nodes: Because ddp-demo-missing was not found"],
    ),
    "is no requirement": (
        "ddp demo dep",
        [
            "requirements.txt line 2: 'ddp demo dep' is not a requirement (Expected semicolon (after name with no "
            "version specifier) or end)"
        ],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_requirement_the_runtime_cannot_take_is_refused_in_one_line_before_anything_is_shipped(tmp_path, index, case):
    import torch

    requirement, parts = REFUSED[case]
    done, _ = launch(tmp_path, index, requirement)
    assert done.returncode != 0
    refusal = next(line for line in done.stderr.splitlines() if line.startswith("  FAILED [localhost] "))
    for part in parts:
        assert part.format(torch=torch.__version__) in refusal, refusal
    assert "- shipping the working directory to shared storage" not in done.stdout


def test_the_nodes_platform_is_their_glibc_within_what_uv_knows():
    def target(glibc: str) -> list[str]:
        return ddp_job_env.node_target({"machine": "x86_64", "glibc": glibc, "python": "3.11.7"})

    assert target("2.36") == ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36"]
    assert target("2.12")[-1] == "x86_64-manylinux_2_17"
    assert target("2.41")[-1] == "x86_64-manylinux_2_40"


def test_only_protected_packages_in_another_version_are_refused(tmp_path):
    requirements = tmp_path / "requirements.txt"
    lines = ["# a comment", "--extra-index-url https://example.invalid", "numpy==1.26.4  # as pinned", "torch<2",
             "scipy>=9", "nvidia-nccl-cu12>2.22", "TorchVision==0.1"]  # fmt: skip
    requirements.write_text("\n".join(lines) + "\n")
    pins = {"numpy": "1.26.4", "torch": "2.5.1", "scipy": "1.0", "nvidia-nccl-cu12": "2.21.5", "torchvision": "0.20"}
    found = ddp_job_env.protected_conflicts(requirements, pins)
    assert [sentence.split(" asks for ")[0] for sentence in found] == [
        "requirements.txt line 4",
        "requirements.txt line 6",
        "requirements.txt line 7",
    ]
    assert "but the runtime pins torchvision 0.20" in found[2]


def test_shared_storage_without_room_for_the_environment_refuses_before_writing_anything(tmp_path, capsys):
    ddp_env = load("ddp_env", ROOT / "ansible/roles/train/files/ddp_env.py")
    spec = {"envs": str(tmp_path / "envs"), "key": "k", "incoming": str(tmp_path / "envs" / ".incoming-k")}
    assert ddp_env.main(["receive", json.dumps(spec | {"bytes": 10**18})]) == 1
    said = capsys.readouterr().err
    assert f"shared storage at {tmp_path}/envs has " in said and "the job's environment needs 1000000000000 MB" in said
    assert not (tmp_path / "envs" / ".incoming-k").exists()
    assert ddp_env.main(["receive", json.dumps(spec | {"bytes": 1000})]) == 0
    assert (tmp_path / "envs" / ".incoming-k").stat().st_mode & 0o777 == 0o700


def test_two_runs_placing_the_same_new_environment_at_once_place_it_once(tmp_path):
    """Each run unpacked its own copy; under the key's lock one renames its copy into place, the other finds it
    there and drops its own. Nobody ever sees a half-placed environment."""
    envs = tmp_path / "envs"
    place = [sys.executable, str(ROOT / "ansible/roles/train/files/ddp_env.py"), "place"]
    copies = []
    for run in ("a", "b"):
        incoming = envs / f".incoming-k-{run}"
        (incoming / "site-packages").mkdir(parents=True)
        (incoming / "site-packages" / "made_by.py").write_text(f"RUN = {run!r}\n")
        copies.append(json.dumps({"envs": str(envs), "key": "k", "incoming": str(incoming)}))
    racing = [subprocess.Popen([*place, spec], stdout=subprocess.PIPE, text=True) for spec in copies]
    reports = [json.loads(process.communicate(timeout=60)[0]) for process in racing]
    assert sorted((r["placed"], r["found"]) for r in reports) == [(False, True), (True, False)], reports
    assert sorted(p.name for p in envs.iterdir()) == ["k", "k.lock"]  # both incoming copies gone
    assert (envs / "k" / "site-packages" / "made_by.py").read_text() in ("RUN = 'a'\n", "RUN = 'b'\n")


@pytest.mark.slow
def test_two_launches_at_once_with_the_same_new_requirements_make_one_environment_and_both_train(tmp_path, index):
    """Both pass the busy check and need the same new key: the controller resolves it once (the second waits on
    the key's lock and finds it), the master places it once, and with WAIT=1 the launch that loses the cluster at
    its start waits for the other instead of failing."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "main.py").write_text(PROGRAM + "import time\ntime.sleep(3)\n")
    (code / "requirements.txt").write_text(f"# {uuid.uuid4().hex}\nddp-demo-dep==1.0\n")
    offline = json.dumps({"train_index_options": ["--no-index", "--find-links", str(index)]})
    with ThreadPoolExecutor(2) as pool:
        launches = [
            pool.submit(
                make_train, f"PROGRAM={code}/main.py", f"JOB=unit-env-{name}", "WAIT=1", f"EXTRA_VARS={offline}"
            )
            for name in ("a", "b")
        ]
        results = [launch.result() for launch in launches]
    for done, run_id in results:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "dep says 1.0" in node_log(run_id)
    said = [next(line for line in done.stdout.splitlines() if line.startswith("  environment ")) for done, _ in results]
    assert sorted(": made for this key in" in line for line in said) == [False, True], said
    assert sum(": reused from shared storage" in line for line in said) == 1, said
    keys = {run_record(run_id)["env"]["key"] for _, run_id in results}
    assert len(keys) == 1
    placed = [path.name for path in (ROOT / "runs/ddp/envs").iterdir() if path.name.startswith(next(iter(keys)))]
    assert sorted(placed) == sorted([next(iter(keys)), next(iter(keys)) + ".lock"]), placed
