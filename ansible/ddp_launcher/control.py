"""A run under control from any terminal: `ddp status`, `ddp logs`, `ddp stop`, `ddp runs`, `ddp report`
(and the make targets of the same names).

    ddp status [--run ID]
    ddp logs [--run ID] [--node NAME] [--follow]
    ddp stop [--run ID]
    ddp runs
    ddp report [--run ID] [--compare ID]

A run is found by its artifacts/<run_id>/run.json (written by the train role at launch and at the end), which
says which inventory, job and nodes it has; --run defaults to the newest run. status, logs and stop run
ansible/playbooks/job.yml against the run's nodes; status and stop collect and judge a run that is over.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import ansible_runner

from . import artifacts
from . import report as run_report
from .contract import LOG_REPORT, POLL_REPORT, RUN_RECORD_VERSION, attempt_of, task_report

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
JOB_PLAYBOOK = ROOT / "ansible" / "playbooks" / "job.yml"


def run_playbook(
    playbook: Path,
    inventory: str | list[str],
    extravars: dict[str, Any],
    on_event: Callable[[dict[str, Any]], None],
    *,
    cmdline: str | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Any:
    """ansible-playbook through ansible-runner, quiet; every event goes to on_event. Returns the runner."""

    def handler(event: dict[str, Any]) -> bool:
        on_event(event)
        return True

    with tempfile.TemporaryDirectory(prefix="ddp-runner-") as private_dir:
        runner = ansible_runner.run(
            private_data_dir=private_dir,
            project_dir=str(ROOT),
            playbook=str(playbook),
            inventory=inventory,
            extravars=extravars,
            cmdline=cmdline,
            # ansible-playbook is the one installed beside this interpreter (the project's .venv).
            envvars={
                "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            },
            quiet=True,
            event_handler=handler,
            cancel_callback=cancel,
        )
        runner.output = runner.stdout.read()  # the private directory goes with this block
    return runner


def extra_vars_cmdline(values: list[str]) -> str:
    """ansible-playbook -e options, with @file made absolute (the playbook runs in another directory)."""
    options = []
    for value in values:
        absolute = "@" + str(Path(value[1:]).resolve()) if value.startswith("@") else value
        options += ["-e", shlex.quote(absolute)]
    return " ".join(options)


# ------------------------------------------------------------------------------------------------ runs


@dataclass
class Run:
    run_id: str
    directory: Path
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.record.get("status", "refused")  # no run.json: stopped before launch

    @property
    def started(self) -> str:
        return self.record.get("started", "")

    @property
    def ended(self) -> bool:
        """Judged and collected once, when it ended: its record says how it went."""
        return bool(self.record.get("ended"))


def all_runs(artifacts: Path = ARTIFACTS) -> list[Run]:
    """Every run under artifacts/, oldest first (runs without run.json, refused before launch, by name)."""
    runs = []
    for directory in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        # A run has run.json, or at least the log of a launch refused before it started (not make doctor's).
        if not ((directory / "run.json").is_file() or (directory / "ansible.log").is_file()):
            continue
        record_file = directory / "run.json"
        record = json.loads(record_file.read_text()) if record_file.is_file() else {}
        runs.append(Run(directory.name, directory, record))
    return sorted(runs, key=lambda run: (run.started, run.run_id))


def find_run(run_id: str | None, artifacts: Path = ARTIFACTS) -> Run:
    launched = [run for run in all_runs(artifacts) if run.record]
    if run_id is None:
        if not launched:
            raise LookupError(f"no run in {artifacts}: start one with make train")
        return readable(launched[-1])
    for run in launched:
        if run.run_id == run_id:
            return readable(run)
    raise LookupError(f"no run {run_id} in {artifacts} (make runs lists them)")


def readable(run: Run) -> Run:
    """The run, unless a newer launcher wrote its run.json in a form this one does not know."""
    version = run.record.get("version", RUN_RECORD_VERSION)
    if not isinstance(version, int) or version > RUN_RECORD_VERSION:
        raise LookupError(
            f"run {run.run_id} was recorded by a newer launcher (run.json version {version}; this one reads up to "
            f"{RUN_RECORD_VERSION}): update this checkout"
        )
    return run


@contextlib.contextmanager
def control_lock(run: Run) -> Iterator[Run]:
    """One status or stop of a run at a time on this controller, so that the first to see its end alone collects
    it (a detached run's watcher asks while its user may); yields the run as recorded once the lock is held. The
    lock files sit apart from the runs' directories, whose contents MANIFEST accounts for."""
    locks = run.directory.parent / ".locks"
    locks.mkdir(exist_ok=True)
    with (locks / f"{run.run_id}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield find_run(run.run_id, run.directory.parent)


def control_vars(run: Run, action: str) -> dict[str, Any]:
    """What job.yml needs to find the run again: its id and job, and the settings that place it."""
    settings = run.record.get("settings", {})
    return {
        "train_job_action": action,
        "train_run_id": run.run_id,
        "train_job_name": run.record["job"],
        "train_group": run.record.get("group", "training"),
        "train_runtime": settings.get("runtime", "host"),
        "train_node_dir": settings["node_dir"],
        "train_shared_dir": settings["shared_dir"],
        "train_artifacts_dir": str(run.directory.parent),
        "train_scheduler": settings.get("scheduler", "none"),
        "train_slurm_job_id": str((run.record.get("slurm") or {}).get("job_id", "")),
        "train_slurm_hosts": (run.record.get("slurm") or {}).get("hosts", {}),
    }


def act(
    run: Run, action: str, on_event: Callable[[dict[str, Any]], None], extra_vars: Sequence[str] = (), **extravars: Any
) -> Any:
    """job.yml on the run; extra_vars are the user's -e options (e.g. who they are on the cluster: cluster_user)."""
    variables = control_vars(run, action) | extravars
    cmdline = extra_vars_cmdline(list(extra_vars)) or None
    return run_playbook(JOB_PLAYBOOK, run.record["inventory"][0], variables, on_event, cmdline=cmdline)


# ------------------------------------------------------------------------------------------------ output


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _elapsed(record: dict[str, Any]) -> float | None:
    try:
        start = datetime.fromisoformat(record["started"])
        end = datetime.fromisoformat(record["ended"]) if record.get("ended") else datetime.utcnow()
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _number(value: object, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, int | float) else "-"


def runs_table(runs: list[Run]) -> list[str]:
    header = (
        f"{'RUN':<36} {'JOB':<16} {'STATUS':<10} {'TRY':<4} {'STEPS':>6} {'LOSS':>8} {'SAMPLES/S':>10} {'TIME':>7}  "
        f"{'CODE':<12}  {'ENV':<12}  OWNER"
    )
    lines = [header]
    for run in runs:
        r = run.record
        code = r.get("code_sha256") or r.get("git_commit") or "-"
        env = (r.get("env") or {}).get("key") or "-"
        lines.append(
            f"{run.run_id:<36} {r.get('job', '-'):<16} {run.status:<10} {attempt_of(r):<4} "
            f"{_number(r.get('last_step'), '{}'):>6} "
            f"{_number(r.get('final_loss'), '{:.4f}'):>8} {_number(r.get('samples_per_s'), '{:.0f}'):>10} "
            f"{duration(_elapsed(r)):>7}  {str(code)[:12]:<12}  {str(env)[:12]:<12}  {r.get('owner', '-')}"
        )
    return lines


def progress_fields(metrics: dict[str, Any] | None) -> str:
    """step n/N (p%), loss, samples/s, ETA: from the master's latest metrics line."""
    if not metrics:
        return "no metrics yet"
    step, target = metrics.get("step"), metrics.get("target_step")
    text = f"step {step}/{target} ({100 * step / target:.0f}%)" if step and target else f"step {step}"
    if isinstance(metrics.get("loss"), int | float):
        text += f", loss {metrics['loss']:.4f}"
    rate = metrics.get("samples_per_s")
    if isinstance(rate, int | float):
        text += f", {rate:.0f} samples/s now"  # the newest step's; the run's summary shows the mean
    step_time = metrics.get("step_time_s")
    if step and target and isinstance(step_time, int | float):
        text += f", ETA {duration((target - step) * step_time)}"
    return text


def queue_line(job: dict[str, Any]) -> str:
    """Where a run waits in Slurm's queue: its job, its place among the waiting jobs and Slurm's reason."""
    place = f"{job.get('position', '?')} of {job.get('waiting', '?')} waiting"
    return f"queued in Slurm as job {job.get('id')}: {place} ({job.get('reason') or 'no reason given'})"


class StatusPrinter:
    def __init__(self) -> None:
        self.reports: dict[str, dict[str, Any]] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        report = task_report(event, POLL_REPORT)
        if report:
            self.reports[data.get("host", "?")] = report
        elif event.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            print(f"  FAILED [{data.get('host')}] {data.get('res', {}).get('msg', '')}", file=sys.stderr)


def print_status(run: Run, printer: StatusPrinter) -> None:
    print(f"run {run.run_id} (job {run.record.get('job')}), started {run.started}, {duration(_elapsed(run.record))}")
    job = next((report.get("job") for report in printer.reports.values()), run.status if run.ended else "unknown")
    print(f"  job: {job}")
    for node, report in sorted(printer.reports.items()):
        age = report.get("heartbeat_age_s")
        line = f"  [{node}] {report.get('node_state')}, heartbeat {'-' if age is None else f'{age:.0f} s'} ago"
        if report.get("exit_code") is not None:
            line += f", exit {report['exit_code']}"
        if report.get("job") == "queued":
            line += f"; {queue_line(report['slurm'])}"
        elif report.get("output"):
            line += f"; last output: {report['output']}"
        elif "metrics" in report:
            line += f"; {progress_fields(report['metrics'])}"
        print(line)
    for line in artifacts.summary_lines(run.directory, run.record):
        print(f"  {line}")


# ------------------------------------------------------------------------------------------------ commands


def status(asked: Run, extra_vars: Sequence[str] = ()) -> int:
    printer = StatusPrinter()
    with control_lock(asked) as run:
        if run.ended:
            # The nodes are not asked again, and nothing is collected twice (a newer run of the job would lend this
            # one its files).
            print_status(run, printer)
            return 0
        runner = act(run, "status", printer, extra_vars)
    print_status(find_run(run.run_id, run.directory.parent), printer)
    return runner.rc


def stop(asked: Run, extra_vars: Sequence[str] = ()) -> int:
    started = time.monotonic()
    printer = StatusPrinter()
    with control_lock(asked) as run:
        if run.ended:
            print(f"run {run.run_id} already ended ({run.status}, {run.record['ended']}): nothing to stop")
            return 0
        runner = act(run, "stop", printer, extra_vars, train_stop_requested=True)
    ended = find_run(run.run_id, run.directory.parent)
    for line in artifacts.summary_lines(ended.directory, ended.record):
        print(f"  {line}")
    print(f"stopped run {run.run_id} everywhere in {time.monotonic() - started:.1f} s")
    return runner.rc


def logs(run: Run, node: str | None, follow: bool, interval_s: float = 2.0) -> int:
    offsets: dict[str, int] = {}
    while True:
        reads: dict[str, dict[str, Any]] = {}

        def on_event(event: dict[str, Any], reads: dict[str, dict[str, Any]] = reads) -> None:
            report = task_report(event, LOG_REPORT)
            if report:
                reads[event["event_data"]["host"]] = report

        runner = act(run, "logs", on_event, __train_log_offsets=offsets, __train_log_nodes=[node] if node else [])
        if runner.rc != 0:
            print(runner.output[-3000:], file=sys.stderr)
            return runner.rc
        for host, read in sorted(reads.items()):
            if read["offset"] == 0 and host not in offsets:
                # Only rank 0 of most programs prints: say that a node is there, silent, rather than nothing.
                print(f"[{host}] (no output yet)", flush=True)
            for line in read["text"].splitlines():
                print(f"[{host}] {line}", flush=True)
            offsets[host] = read["offset"]
        if not follow or (reads and all(read.get("ended") for read in reads.values())):
            return 0
        time.sleep(interval_s)


ACTIONS = {
    "status": "each node's state, heartbeat age, the master's step, loss, throughput and ETA",
    "logs": "the nodes' logs, each line prefixed by its node",
    "stop": "stop a run on every node, then collect it",
    "runs": "one line per run: id, job, status, attempt, steps, final loss, samples/s, duration, code, environment key",
    "report": "rebuild a run's report.html (plots, settings, versions)",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    if not argv or argv[0] not in ACTIONS:
        raise SystemExit(f"usage: ddp {{{','.join(ACTIONS)}}} [options]")
    action = argv[0]
    parser = argparse.ArgumentParser(prog=f"ddp {action}", description=ACTIONS[action])
    if action != "runs":
        parser.add_argument("--run", help="run id (default: the newest run; `ddp runs` lists them)")
    if action == "logs":
        parser.add_argument("--node", help="only this node")
        parser.add_argument("--follow", action="store_true", help="keep printing until every node's part ended")
    if action == "report":
        parser.add_argument("--compare", help="another run's id, drawn over this one")
    parser.add_argument("--artifacts", type=Path, default=ARTIFACTS, help="where the runs are (train_artifacts_dir)")
    if action in ("status", "stop"):
        parser.add_argument(
            "-e", "--extra-vars", action="append", default=[], help="ansible-playbook -e (e.g. cluster_user=NAME)"
        )
    return parser.parse_args(argv[1:], namespace=argparse.Namespace(action=action))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.action == "runs":
        print("\n".join(runs_table(all_runs(args.artifacts))))
        print(f"each run's report: {args.artifacts}/<run_id>/report.html (make report RUN=<run_id> [COMPARE=<id>])")
        return 0
    try:
        run = find_run(args.run or None, args.artifacts)
    except LookupError as error:
        print(f"make {args.action}: {error}", file=sys.stderr)
        return 2
    if args.action == "status":
        return status(run, args.extra_vars)
    if args.action == "stop":
        return stop(run, args.extra_vars)
    if args.action == "report":
        other = ["--compare", str(find_run(args.compare, args.artifacts).directory)] if args.compare else []
        return run_report.main([str(run.directory), *other])
    return logs(run, args.node, args.follow)


if __name__ == "__main__":
    sys.exit(main())
