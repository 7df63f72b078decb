"""`make bench`: the cluster's figures of merit, each a ratio of two numbers measured in the same run.

    ddp bench [--inventory inventory/local] [--artifacts DIR] [--site-seconds CONVERGE RERUN CHANGED]
              [--launch-seconds S --run-dir DIR] [--data-files N] [--p7-pairs N]
              [--only p1 p2 p3 p4 p6 p6lab p7 p8]

Writes <artifacts>/bench-<time>/bench.json and prints a table:
  p1_allreduce_busbw_over_link   allreduce busbw at 64 MiB over the iperf3 bandwidth of the slowest node pair
                                 (make doctor's measurements, this run's)
  p2_scaling_efficiency          samples/s on N nodes / (N x samples/s on the first node alone), same per-process
                                 batch (train.yml with train_group cut to one node); null on one node
  p3_noop_rerun_over_converge    a site.yml rerun's wall time over the first converge's, with the rerun's changed
                                 count; measured where site.yml runs (the lab, the e2e stage), passed in with
                                 --site-seconds; null here otherwise, with the reason
  p4_checkpoint_stall_fraction   time training was blocked by checkpoints over its wall time, at the default
                                 checkpoint cadence, with a checkpoint of at least 50 MB; the staged save (the
                                 default), with the blocking save's figure beside it
  p6_launch_over_bare_torchrun   `make train`'s wall time for the inventory's default job over the bare torchrun
                                 command it ran (from run.json), rerun alone on this machine; one-node inventories
                                 with the host runtime (inventory/local), null elsewhere with the reason
  p6_lab_overhead_over_training  (`make train`'s wall time - the program's training time) / that training time,
                                 for the lab's run that the e2e stage makes (--launch-seconds, --run-dir)
  p7_env_cache_hit_overhead_s    a launch whose job environment is already made minus the same launch without
                                 requirements (the fastest of --p7-pairs each, 2 by default, after the miss that
                                 made it), with the hits' own environment tasks beside it; the requirement is a
                                 local demo wheel, so no index is reached
  p8_data_resync_s               the sync tasks' own time in a launch whose dataset (--data-files of 1 MB, 1,000 by
                                 default) is already on shared storage unchanged
Every null comes with its reason; the raw numbers behind each ratio, the machine, versions and git commit too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import control, doctor, train

ROOT = control.ROOT
TRAIN_PLAYBOOK = ROOT / "ansible" / "playbooks" / "train.yml"
# cpu-smoke's CNN at this width has 6.7M parameters: with SGD momentum a checkpoint of about 54 MB.
CHECKPOINT_WIDTH = 300
SCALING_STEPS = 40
STALL_STEPS = 100  # the config's default checkpoint cadence over 100 steps, the last save the final one
# --only's names for the figures, and the keys they are written under in bench.json.
FIGURES = {
    "p1": "p1_allreduce_busbw_over_link",
    "p2": "p2_scaling_efficiency",
    "p3": "p3_noop_rerun_over_converge",
    "p4": "p4_checkpoint_stall_fraction",
    "p6": "p6_launch_over_bare_torchrun",
    "p6lab": "p6_lab_overhead_over_training",
    "p7": "p7_env_cache_hit_overhead_s",
    "p8": "p8_data_resync_s",
}
# p7's requirement: the tests' demo wheels, made on the spot (molecule/shared/demo_wheels.py).
DEMO_WHEELS = ROOT / "molecule" / "shared" / "demo_wheels.py"
# p8's dataset on shared storage: one name, so that repeated benches overwrite rather than add a copy each.
BENCH_DATA_NAME = "ddp-bench-resync"


def train_run(inventory: str | list[str], artifacts: Path, run_id: str, extravars: dict[str, Any]) -> dict[str, Any]:
    """One train.yml run of the built-in program; its summary.json, or {"error": ...}."""
    base = {"train_run_id": run_id, "train_job_name": run_id, "train_resume": "never"}
    runner = control.run_playbook(
        TRAIN_PLAYBOOK, inventory, base | {"train_artifacts_dir": str(artifacts)} | extravars, lambda _: None
    )
    summary = artifacts / run_id / "metrics" / "summary.json"
    if runner.rc != 0 or not summary.is_file():
        return {"error": f"run {run_id} failed: see {artifacts / run_id}"}
    return json.loads(summary.read_text())


def args_with(*extra: str) -> list[str]:
    """The built-in program's arguments (its defaults' shape), plus extra ones."""
    return [
        *("--config", "{{ train_config }}", "--steps", "{{ train_steps }}", "--resume", "never"),
        *("--checkpoint-dir", "{{ train_checkpoint_dir }}", "--output-dir", "{{ train_output_dir }}", *extra),
    ]


def p1(examined: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    link = doctor.link_gbit(examined.get("pairs", []))
    row = next((r for r in bench.get("results", []) if r["size_bytes"] == 64 << 20), None)
    if link is None or row is None:
        return {"value": None, "reason": "no iperf3 pair or no 64 MiB allreduce measured", "link_gbit_per_s": link}
    return {
        "value": round(row["busbw_gbps"] / (link / 8), 4),
        "busbw_gbyte_per_s_64mib": round(row["busbw_gbps"], 4),
        "link_gbyte_per_s": round(link / 8, 4),
        "world_size": bench.get("world_size"),
    }


def p2(nodes: list[str], inventory: str, artifacts: Path, stamp: str) -> dict[str, Any]:
    if len(nodes) < 2:
        return {"value": None, "reason": f"one training node ({nodes[0]}): nothing to scale across"}
    settings = {"train_steps": SCALING_STEPS, "train_program_args": args_with("--checkpoint-every", "0")}
    many = train_run(inventory, artifacts, f"{stamp}-scale-n{len(nodes)}", settings)
    # The first node alone: a group of its own, from a second inventory source beside the cluster's.
    alone = artifacts / stamp / "one-node.yml"
    alone.write_text(json.dumps({"bench_one_node": {"hosts": {nodes[0]: {}}}}))
    one = train_run(
        [inventory, str(alone)], artifacts, f"{stamp}-scale-n1", settings | {"train_group": "bench_one_node"}
    )
    if "error" in many or "error" in one:
        return {"value": None, "reason": many.get("error") or one.get("error")}
    rate_n, rate_1 = many["mean_samples_per_s"], one["mean_samples_per_s"]
    return {
        "value": round(rate_n / (len(nodes) * rate_1), 4),
        "samples_per_s_n_nodes": rate_n,
        "samples_per_s_one_node": rate_1,
        "nodes": len(nodes),
        "world_sizes": [many.get("world_size"), one.get("world_size")],
    }


def p3(site_seconds: list[float] | None) -> dict[str, Any]:
    if not site_seconds:
        return {
            "value": None,
            "reason": "site.yml does not run against this inventory here (inventory/local is refused by it): the "
            "lab and the e2e stage measure it (tests/e2e), or pass --site-seconds CONVERGE RERUN CHANGED",
        }
    converge, rerun, changed = site_seconds
    return {
        "value": round(rerun / converge, 4),
        "converge_s": round(converge, 1),
        "rerun_s": round(rerun, 1),
        "rerun_changed": int(changed),
    }


def stall(inventory: str, artifacts: Path, run_id: str, staged: bool) -> dict[str, Any]:
    settings = {
        "train_steps": STALL_STEPS,
        "train_program_args": args_with(
            "--set", f"model.width={CHECKPOINT_WIDTH}", "--set", f"checkpoint.async={staged}"
        ),
    }
    summary = train_run(inventory, artifacts, run_id, settings)
    if "error" in summary:
        return summary
    sizes = [c["bytes"] for c in _jsonl(artifacts / run_id / "metrics" / "checkpoints.jsonl") if c.get("bytes")]
    return {
        "fraction": round(summary["checkpoint_block_s_total"] / summary["wall_time_s"], 4),
        "checkpoint_block_s_total": round(summary["checkpoint_block_s_total"], 3),
        "wall_time_s": round(summary["wall_time_s"], 2),
        "checkpoints": summary.get("checkpoints_written"),
        "checkpoint_bytes": max(sizes, default=None),
    }


def p4(inventory: str, artifacts: Path, stamp: str) -> dict[str, Any]:
    """The staged save (the default) and, for comparison, the blocking one, on the same model."""
    staged = stall(inventory, artifacts, f"{stamp}-stall", staged=True)
    blocking = stall(inventory, artifacts, f"{stamp}-stall-blocking", staged=False)
    if "error" in staged:
        return {"value": None, "reason": staged["error"]}
    return {"value": staged.pop("fraction"), **staged, "blocking_save": blocking}


def p6(inventory: str, artifacts: Path, stamp: str) -> dict[str, Any]:
    """`ddp train` (what `make train` runs) of the inventory's default job over the bare torchrun command it ran,
    taken from its run.json and run again on this machine: same program, arguments and environment."""
    run_id = f"{stamp}-launch"
    extravars = {"train_run_id": run_id, "train_job_name": run_id, "train_artifacts_dir": str(artifacts)}
    launch = [sys.executable, "-m", "ddp_launcher", "train", "--inventory", inventory, "--resume", "never"]
    started = time.monotonic()
    launched = subprocess.run(
        [*launch, "--extra-vars", json.dumps(extravars)], capture_output=True, text=True, timeout=1800, check=False
    )
    launch_s = time.monotonic() - started
    record_file = artifacts / run_id / "run.json"
    if launched.returncode != 0 or not record_file.is_file():
        return {"value": None, "reason": f"make train failed: see {artifacts / run_id}"}
    record = json.loads(record_file.read_text())
    if len(record["nodes"]) != 1 or record["settings"]["runtime"] != "host":
        return {
            "value": None,
            "reason": "the bare command is rerun on this machine: a one-node inventory with the host runtime "
            "(inventory/local); the lab's launch overhead is p6_lab_overhead_over_training, from the e2e stage",
        }
    # The same command as a run of its own (rendezvous id, output and checkpoint dirs carry the run id).
    command = [arg.replace(run_id, f"{run_id}-bare") for arg in next(iter(record["nodes"].values()))]
    env = os.environ | {"PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} | record["settings"]["env"]
    started = time.monotonic()
    bare = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
    bare_s = time.monotonic() - started
    if bare.returncode != 0:
        return {"value": None, "reason": f"the bare torchrun failed: {bare.stderr.strip()[-300:]}"}
    return {
        "value": round(launch_s / bare_s, 2),
        "launch_s": round(launch_s, 1),
        "bare_torchrun_s": round(bare_s, 1),
        "overhead_s": round(launch_s - bare_s, 1),
        "steps": record.get("last_step"),
    }


def p6_lab(launch_s: float | None, run_dir: Path | None) -> dict[str, Any]:
    """What a launch costs around its training on the lab: (`make train`'s wall time - the program's own training
    time, from its summary.json) over that training time. The e2e stage passes the run it makes anyway; the
    overhead counts everything a user waits for besides the training loop: the checks, starting torchrun and the
    program (its torch import: half a minute per node under TCG), stopping, collecting and the report."""
    if launch_s is None or run_dir is None:
        return {"value": None, "reason": "from the e2e stage's lab run: --launch-seconds S --run-dir artifacts/<run>"}
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    training_s = float(summary["wall_time_s"])
    overhead_s = launch_s - training_s
    return {
        "value": round(overhead_s / training_s, 2),
        "launch_s": round(launch_s, 1),
        "training_s": round(training_s, 1),
        "overhead_s": round(overhead_s, 1),
        "steps": summary.get("last_step"),
        "run": run_dir.name,
    }


def shipped_run(inventory: str, artifacts: Path, program: Path, run_id: str, extravars: dict[str, Any]) -> Any:
    """One launch of a shipped program, as `make train PROGRAM=...` makes it: its runner, its wall time and the
    seconds each stage's tasks took on the master (from the events' durations)."""
    stages: dict[str, float] = {}

    def on_event(event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("duration") is not None:
            name = Path(str(data.get("task_path", "")).split(":")[0]).name
            stages[name] = stages.get(name, 0.0) + float(data["duration"])

    shipped = train.program_vars(program, "", None, run_id.rsplit("-", 1)[0])
    settings = shipped | {"train_run_id": run_id, "train_artifacts_dir": str(artifacts), "train_resume": "never"}
    started = time.monotonic()
    runner = control.run_playbook(TRAIN_PLAYBOOK, inventory, settings | extravars, on_event)
    runner.wall_s, runner.stage_s = time.monotonic() - started, stages
    return runner


def p7(inventory: str, artifacts: Path, stamp: str, pairs: int = 2) -> dict[str, Any]:
    """The cost of a job environment that is already made: the same tiny program launched with and without a
    requirements file, alternating `pairs` times, after a first launch made the environment (a key new to this
    bench)."""
    work = artifacts / stamp / "p7"
    plain, with_env = work / "plain" / "main.py", work / "env" / "main.py"
    for program in (plain, with_env):
        program.parent.mkdir(parents=True)
        program.write_text("print('bench')\n")
    (with_env.parent / "requirements.txt").write_text(f"ddp-demo-dep==1.0\n# {stamp}: a key of its own\n")
    spec = importlib.util.spec_from_file_location("demo_wheels", DEMO_WHEELS)
    demo_wheels = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(demo_wheels)  # type: ignore[union-attr]
    index = {"train_index_options": ["--no-index", "--find-links", str(demo_wheels.demo_index(work / "wheels"))]}
    times: dict[str, list[float]] = {"miss": [], "plain": [], "hit": []}
    env_tasks: list[float] = []  # the hits' own environment tasks: the difference without the launches' noise
    for number, (kind, program) in enumerate((("miss", with_env), *(("plain", plain), ("hit", with_env)) * pairs)):
        runner = shipped_run(inventory, artifacts, program, f"{stamp}-p7-{number}", index)
        if runner.rc != 0:
            return {"value": None, "reason": f"a {kind} launch failed: see {artifacts}/{stamp}-p7-*"}
        times[kind].append(runner.wall_s)
        if kind == "hit":
            env_tasks.append(runner.stage_s.get("job_env.yml", 0.0))
    hit, plain = ([round(t, 2) for t in times[kind]] for kind in ("hit", "plain"))
    return {
        "value": round(min(hit) - min(plain), 2),  # from the numbers shown, so that it is their difference
        "launch_hit_s": hit,
        "launch_plain_s": plain,
        "launch_miss_s": round(times["miss"][0], 2),
        "hit_env_tasks_s": [round(t, 2) for t in env_tasks],
    }


def p8(inventory: str, artifacts: Path, stamp: str, files: int) -> dict[str, Any]:
    """An unchanged dataset's re-sync: the sync tasks' time in the second of two launches with the same DATA."""
    data = artifacts / stamp / "p8-data"
    data.mkdir(parents=True)
    for number in range(files):
        (data / f"part-{number:05d}.bin").write_bytes(os.urandom(1 << 20))
    program = artifacts / stamp / "p8" / "main.py"
    program.parent.mkdir(parents=True)
    program.write_text("print('bench')\n")
    settings = {"train_data_dir": str(data), "train_data_name": BENCH_DATA_NAME, "train_data_delete": True}
    synced = [shipped_run(inventory, artifacts, program, f"{stamp}-p8-{n}", settings) for n in range(2)]
    shutil.rmtree(data)
    if any(runner.rc != 0 for runner in synced):
        return {"value": None, "reason": f"a launch with DATA failed: see {artifacts}/{stamp}-p8-*"}
    first, again = (runner.stage_s.get("sync_data.yml", 0.0) for runner in synced)
    return {"value": round(again, 2), "first_sync_s": round(first, 2), "files": files, "bytes": files << 20}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "git_commit": commit.stdout.strip() or None,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inventory", default="inventory/local")
    parser.add_argument("--artifacts", type=Path, default=control.ARTIFACTS)
    parser.add_argument("--site-seconds", type=float, nargs=3, metavar=("CONVERGE", "RERUN", "CHANGED"))
    # ... and p6lab from the lab training run it makes anyway: its wall time and its collected directory.
    parser.add_argument("--launch-seconds", type=float)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--data-files", type=int, default=1000, help="p8's dataset: this many files of 1 MB")
    parser.add_argument("--p7-pairs", type=int, default=2, help="p7's launches without and with the environment")
    # The e2e stage records p3 from the site.yml runs it makes anyway, without measuring the rest again.
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    args = parser.parse_args(argv)
    inventory = str((ROOT / args.inventory).resolve())
    artifacts = args.artifacts.resolve()
    stamp = time.strftime("bench-%Y%m%d-%H%M%S", time.gmtime())
    out = artifacts / stamp
    out.mkdir(parents=True)

    diagnosis: dict[str, Any] = {"nodes": {}}
    if {"p1", "p2"} & set(args.only):
        print("- the nodes, their links and an allreduce sweep (make doctor)", flush=True)
        doctor.main(["--inventory", args.inventory, "--artifacts", str(artifacts)])
        diagnosis = json.loads((sorted(artifacts.glob("doctor-*/doctor.json"))[-1]).read_text())
    measure = {
        "p1": lambda: p1(diagnosis, diagnosis.get("allreduce") or {}),
        "p2": lambda: p2(sorted(diagnosis["nodes"]), inventory, artifacts, stamp),
        "p3": lambda: p3(args.site_seconds),
        "p4": lambda: p4(inventory, artifacts, stamp),
        "p6": lambda: p6(inventory, artifacts, stamp),
        "p6lab": lambda: p6_lab(args.launch_seconds, args.run_dir),
        "p7": lambda: p7(inventory, artifacts, stamp, args.p7_pairs),
        "p8": lambda: p8(inventory, artifacts, stamp, args.data_files),
    }
    results: dict[str, dict[str, Any]] = {}
    for short, key in FIGURES.items():
        if short not in args.only:
            results[key] = {"value": None, "reason": f"not measured in this run (--only {' '.join(args.only)})"}
            continue
        print(f"- {key}", flush=True)
        results[key] = measure[short]()
    versions = {node: {"python": n.get("python"), "torch": n.get("torch")} for node, n in diagnosis["nodes"].items()}
    bench = {"id": stamp, "inventory": args.inventory, **results, "machine": machine(), "versions": versions}
    (out / "bench.json").write_text(json.dumps(bench, indent=2) + "\n")
    for key, result in results.items():
        value = "null" if result["value"] is None else f"{result['value']:.3f}"
        raw = result.get("reason") or ", ".join(f"{k} {v}" for k, v in result.items() if k != "value")
        print(f"{key:<32} {value:>7}  {raw}")
    print(f"bench.json: {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
