"""`make train`: runs ansible/playbooks/train.yml through ansible-runner and shows the job, not the play.

    ddp train [--inventory inventory/local] [--resume auto|never]
        [--program path/to/script.py [--args '5 1 --batch_size 32'] [--workdir DIR] [--job NAME]]
        [--data PATH[:NAME]] [--requirements FILE] [--detach] [--wait]
        [--extra-vars VARS ...]

--program ships the controller's DIR (default: the program's directory) to shared storage and runs the
program from there with exactly --args; --extra-vars takes what `ansible-playbook -e` takes (KEY=VALUE pairs,
JSON or YAML, @file).

Prints one line per stage, a progress line from rank 0's metrics when it changes, the failing node's first
error and log tail when the run fails, and the closing summary. The full Ansible output is kept in
artifacts/<run_id>/ansible.log. Exits with the playbook's exit code; --detach returns once every node runs (a
run that train_retries allows to retry is then watched from this machine: detached.py).
Ctrl-C or SIGTERM stops the run on every node, collects what exists, marks it cancelled and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import artifacts as run_files
from . import control, detached
from . import report as run_report
from .artifacts import summary_lines
from .contract import BUSY_REPORT, ENV_REPORT, POLL_REPORT, STAGE_REPORT, task_report

ROOT = control.ROOT
PLAYBOOK = ROOT / "ansible" / "playbooks" / "train.yml"
# The run's stages, each a task file of one job: a line when the first task of that file starts. Task titles
# carry no meaning here (test_progress_contract refuses any in this package).
STAGES = {
    "train/tasks/validate.yml": "checking the inventory",
    "gpu_stack/tasks/check_consistency.yml": "checking driver, CUDA and NCCL versions agree",
    "train/tasks/preflight.yml": "preflight on every node",
    "train/tasks/preflight_node.yml": "checking each node: runtime, shared directories, rendezvous port",
    "train/tasks/ship.yml": "shipping the working directory to shared storage",
    "train/tasks/sync_data.yml": "syncing the dataset to shared storage",
    "train/tasks/job_env.yml": "the job's Python environment (requirements)",
    "train/tasks/run.yml": "starting torchrun on every node",
    "train/tasks/stop.yml": "stopping the run everywhere",
    "train/tasks/collect.yml": "collecting checkpoints, metrics and logs",
}
# The module that packs train_workdir on the controller; its result says what was packed.
PACK_MODULE = "ddp_pack_workdir"
# The module that packs a dataset's changes; its result says what moves.
DATA_MODULE = "ddp_pack_data"


def stage_of(task_path: str | None) -> str | None:
    """The stage a task belongs to, by the role task file it sits in (task_path is 'file:line')."""
    file = (task_path or "").rpartition(":")[0] or (task_path or "")
    return next((stage for suffix, stage in STAGES.items() if file.endswith("/roles/" + suffix)), None)


def progress_line(host: str, report: dict[str, Any], elapsed_s: float) -> str:
    """step n/N (p%), loss, samples/s, elapsed, ETA: from the master's newest metrics line."""
    if report.get("job") == "queued":
        return f"  [{host}] {control.queue_line(report['slurm'])}, elapsed {control.duration(elapsed_s)}"
    if not report.get("metrics"):
        if report.get("output"):
            # No metrics (a program of the user's that writes none): what it printed last, and for how long.
            return f"  [{host}] {report['output']}, elapsed {control.duration(elapsed_s)}"
        return f"  [{host}] {report.get('job', '?')}: waiting for the first step"
    return f"  [{host}] {control.progress_fields(report['metrics'])}, elapsed {control.duration(elapsed_s)}"


def env_line(report: dict[str, Any], elapsed_s: float) -> str:
    """Whether the job's environment was reused or made, what that added to the launch (the stage's time so far:
    keying it and looking for it, and on a miss making and placing it), and what it adds to the runtime's."""
    key = str(report["key"])[:12]
    if report["found"]:
        return f"environment {key}: reused from shared storage, {elapsed_s:.1f} s"
    added = ", ".join(report.get("packages") or []) or "nothing beyond the runtime's own"
    return f"environment {key}: made for this key in {elapsed_s:.1f} s, adding {added}"


def data_line(result: dict[str, Any]) -> str:
    """What a dataset sync moves: files and bytes sent of the whole, and what leaves the shared copy."""
    line = (
        f"dataset: {result.get('files', 0)} files, {result.get('bytes', 0) / 1e6:.1f} MB; sending "
        f"{result.get('sent_files', 0)} new or changed ({result.get('sent_bytes', 0) / 1e6:.1f} MB)"
    )
    if result.get("deleted"):
        line += f", removing {result['deleted']} the controller no longer has"
    if result.get("stale"):
        line += f"; {result['stale']} only on shared storage kept (train_data_delete: true removes them)"
    return line


def stage_line(report: dict[str, Any]) -> str:
    """What a node's local copy of the dataset needed."""
    if not report["copied_files"] and not report["removed"]:
        return f"dataset staged locally: current ({report['files']} files)"
    line = (
        f"dataset staged locally: copied {report['copied_files']} of {report['files']} files "
        f"({report['copied_bytes'] / 1e6:.1f} MB)"
    )
    return line + (f", removed {report['removed']}" if report["removed"] else "")


class Printer:
    """Turns runner events into a short account of the run."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.last_progress: dict[str, str] = {}
        self.stages_seen: set[str] = set()
        self.started = time.monotonic()
        self.waiting_on: str | None = None
        self.slurm_job: str | None = None

    def __call__(self, event: dict[str, Any]) -> bool:
        data = event.get("event_data", {})
        kind = event.get("event", "")
        result = data.get("res", {})
        stage = stage_of(data.get("task_path")) if kind == "playbook_on_task_start" else None
        if stage and stage not in self.stages_seen:
            self.stages_seen.add(stage)
            print(f"- {stage}", flush=True)
            self.started = time.monotonic()  # elapsed counts from the latest stage: in the end, the launch
        elif report := task_report(event, POLL_REPORT):
            self._progress(data.get("host", "?"), report, self.last_progress, time.monotonic() - self.started)
        elif kind == "runner_on_ok" and data.get("resolved_action", data.get("task_action")) == PACK_MODULE:
            print(
                f"  packed {result.get('files')} files, {result.get('bytes', 0) / 1e3:.1f} kB, "
                f"sha256 {str(result.get('sha256'))[:12]}",
                flush=True,
            )
        elif self._preparation(event):
            pass
        elif kind == "runner_on_ok" and data.get("resolved_action", data.get("task_action")) == DATA_MODULE:
            print(f"  {data_line(result)}", flush=True)
        elif kind == "runner_on_ok" and "train_run_id" in result.get("ansible_facts", {}):
            self.run_id = result["ansible_facts"]["train_run_id"]
        elif kind == "runner_on_ok" and "train_slurm_job_id" in result.get("ansible_facts", {}):
            if self.slurm_job is None:
                self.slurm_job = str(result["ansible_facts"]["train_slurm_job_id"])
                print(f"  submitted to Slurm as job {self.slurm_job}", flush=True)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            # A failing command's own words say more than Ansible's "non-zero return code".
            said = (result.get("stderr") or result.get("stdout") or "").strip().splitlines()[-5:]
            print(f"  FAILED [{data.get('host')}] {result.get('msg', '')}", file=sys.stderr, flush=True)
            for line in said:
                print(f"    {line}", file=sys.stderr, flush=True)
        elif kind == "runner_on_unreachable":
            print(f"  UNREACHABLE [{data.get('host')}] {result.get('msg', '')}", file=sys.stderr, flush=True)
        return True

    def _preparation(self, event: dict[str, Any]) -> bool:
        """Prints what a node said of the launch's preparation (a busy cluster, the environment, the dataset);
        False for any other event."""
        if (report := task_report(event, BUSY_REPORT)) and event.get("event") == "runner_retry":
            # train_wait: one line each time the running run moves on (or another takes its place).
            if report["message"] != self.waiting_on:
                self.waiting_on = report["message"]
                print(f"  waiting: {report['message']}", flush=True)
        elif report := task_report(event, STAGE_REPORT):
            print(f"  [{event['event_data'].get('host', '?')}] {stage_line(report)}", flush=True)
        elif report := task_report(event, ENV_REPORT):
            if report["found"] or report["placed"]:
                print(f"  {env_line(report, time.monotonic() - self.started)}", flush=True)
        else:
            return False
        return True

    @staticmethod
    def _progress(host: str, report: dict[str, Any], last: dict[str, str], elapsed_s: float) -> None:
        if "metrics" in report:
            line = progress_line(host, report, elapsed_s)
            # One line per change of step (or of the output line): a poll that saw nothing new says nothing.
            if line.rsplit(", elapsed", 1)[0] != last.get(host, "").rsplit(", elapsed", 1)[0]:
                last[host] = line
                print(line, flush=True)


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inventory", default="inventory/local", help="inventory directory or file")
    parser.add_argument("--resume", default="auto", help="auto (newest valid checkpoint), never, or a path")
    parser.add_argument("--program", type=Path, help="a script on this machine, shipped with its directory")
    parser.add_argument("--args", default="", help="the program's arguments, split as a shell would")
    parser.add_argument("--workdir", type=Path, help="the directory shipped (default: the program's)")
    parser.add_argument("--job", help="job name (default: the workdir's name); its work dir persists across runs")
    parser.add_argument("--requirements", type=Path, help="the job's requirements file (default: WORKDIR's)")
    parser.add_argument(
        "--data", metavar="PATH[:NAME]", help="a dataset directory, synced to <shared_dir>/data/NAME (DDP_DATA_DIR)"
    )
    parser.add_argument("--detach", action="store_true", help="return once every node runs the job")
    parser.add_argument("--wait", action="store_true", help="on a cluster busy with another run, wait for it")
    parser.add_argument("--artifacts", type=Path, help="train_artifacts_dir (default: the inventory's)")
    # The watcher of a detached run (detached.py): follows that run, then retries it as this launch would.
    parser.add_argument("--after-detached", metavar="RUN", help=argparse.SUPPRESS)
    parser.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        default=[],
        metavar="VARS",
        help="as ansible-playbook -e: KEY=VALUE pairs, JSON or YAML, or @file (repeatable)",
    )
    return parser.parse_args(argv)


class UsageError(ValueError):
    """A command line that cannot name a program to ship."""


def program_vars(program: Path, args: str, workdir: Path | None, job: str | None) -> dict[str, Any]:
    """The playbook variables that ship `program` with its working directory and run it with exactly `args`."""
    program = program.resolve()
    workdir = (workdir or program.parent).resolve()
    if not program.is_file():
        raise UsageError(f"PROGRAM={program}: no such file")
    if not program.is_relative_to(workdir):
        raise UsageError(f"PROGRAM={program} is not inside WORKDIR={workdir}")
    shipped = {
        "train_workdir": str(workdir),
        "train_program": str(program.relative_to(workdir)),
        "train_job_name": job or re.sub(r"[^A-Za-z0-9._-]+", "-", workdir.name).strip(".-") or "job",
    }
    # Without ARGS the role's default for a shipped program (no arguments) or EXTRA_VARS decide: runner's
    # extravars would win over EXTRA_VARS' train_program_args.
    return shipped | ({"train_program_args": shlex.split(args)} if args else {})


def data_vars(data: str) -> dict[str, Any]:
    """PATH[:NAME] as the playbook's variables: the directory, absolute, and its name on shared storage."""
    path, _, name = data.partition(":")
    directory = Path(path).expanduser().resolve()
    if not directory.is_dir():
        raise UsageError(f"DATA={data}: {directory} is not a directory")
    return {"train_data_dir": str(directory), "train_data_name": name}


def run_tag() -> str:
    """The unique part of a fresh run's id (train_run_tag): UTC time to the second, and four random hex digits
    that keep apart two launches of one job in the same second."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def launch_vars(args: argparse.Namespace) -> dict[str, Any]:
    """The playbook variables the command line sets (UsageError: it cannot be run as written)."""
    extravars: dict[str, Any] = {
        "train_resume": args.resume,
        "train_detach": args.detach,
        "train_wait": args.wait,
        "train_run_tag": run_tag(),
    }
    if args.program:
        extravars |= program_vars(args.program, args.args, args.workdir, args.job)
    elif args.args or args.workdir:
        raise UsageError("ARGS and WORKDIR go with PROGRAM=path/to/script.py")
    elif args.job:
        extravars["train_job_name"] = args.job
    if args.requirements:
        requirements = args.requirements.resolve()
        if not requirements.is_file():
            raise UsageError(f"REQUIREMENTS={args.requirements}: no such file")
        extravars["train_requirements"] = str(requirements)
    if args.data:
        extravars |= data_vars(args.data)
    return extravars


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, prog)
    try:
        extravars = launch_vars(args)
    except UsageError as error:
        print(f"make train: {error}", file=sys.stderr)
        return 2
    artifacts = (args.artifacts or control.ARTIFACTS).resolve()
    if args.artifacts:
        extravars["train_artifacts_dir"] = str(artifacts)

    # Ctrl-C reaches the whole foreground process group: ansible-playbook stops by itself; the job's processes
    # run in sessions of their own and are stopped below, through the same path as `make stop`.
    interrupted = threading.Event()
    received: list[int] = []

    def interrupt(signum: int, _frame: object) -> None:
        received.append(signum)
        interrupted.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    attempts: list[str] = []
    if args.after_detached and not retry_after_detached(args, artifacts, extravars, attempts):
        return 0
    while True:
        printer = Printer()
        run = control.run_playbook(
            PLAYBOOK,
            str((ROOT / args.inventory).resolve()),
            extravars,
            printer,
            cmdline=control.extra_vars_cmdline(args.extra_vars) or None,
            cancel=interrupted.is_set,
        )
        if printer.run_id:
            attempts.append(printer.run_id)
            destination = artifacts / printer.run_id / "ansible.log"
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(run.output)
            print(f"  full Ansible output: {destination}")
        retry = None if interrupted.is_set() or args.detach else retry_of(printer.run_id, artifacts)
        if retry is None:
            break
        next_attempt(retry, extravars, attempts)
    record_attempts(attempts, artifacts)
    if interrupted.is_set():
        cancel(printer.run_id, artifacts)
        # Die of the signal, as an interrupted command does: make and shells then stop too (exit 130 for SIGINT).
        signal.signal(received[0], signal.SIG_DFL)
        os.kill(os.getpid(), received[0])
    if run.rc == 0 and args.detach:
        print_detached(printer, argv, artifacts)
        return 0
    print_summary(printer.run_id, artifacts)
    print(f"training {'finished' if run.rc == 0 else 'FAILED'} (status {run.status}, exit {run.rc})")
    return run.rc


# What a program exits with when its arguments or its config are wrong (argparse's code): no retry mends that.
USAGE_ERROR = 2


def retry_of(run_id: str | None, artifacts: Path) -> str | None:
    """Why a run that ended should be launched again (its failure, in words), or None: it did not fail, it failed in
    a way a retry cannot mend (a usage or config error, its time limit), or it had its attempts
    (settings.retries, train_retry_exit_codes)."""
    record_file = artifacts / str(run_id) / "run.json"
    if run_id is None or not record_file.is_file():
        return None  # refused before launch: a retry would be refused the same way
    record = json.loads(record_file.read_text())
    settings = record.get("settings", {})
    attempt, retries = int(record.get("attempt", 1)), int(settings.get("retries", 0))
    if record.get("status") != "failed" or attempt > retries:
        return None
    codes, code = settings.get("retry_exit_codes") or [], record.get("exit_code")
    if codes and code not in codes:
        return None
    if not codes and (code == USAGE_ERROR or "train_timeout_s" in str(record.get("reason"))):
        return None
    return f"attempt {attempt} of {retries + 1} failed on {record.get('failed_node')}: {record.get('reason')}"


def retry_after_detached(
    args: argparse.Namespace, artifacts: Path, extravars: dict[str, Any], attempts: list[str]
) -> bool:
    """The watcher of a detached run: once the run ended, whether it is retried (extravars and attempts then
    name the next attempt)."""
    watched = detached.wait_for_end(args.after_detached, artifacts, args.extra_vars)
    retry = retry_of(watched.run_id, artifacts)
    if retry is None:
        print(f"run {watched.run_id} ended: {watched.status}")
        return False
    attempts.append(watched.run_id)
    extravars["train_run_tag"] = watched.run_id.removeprefix(f"{watched.record['job']}-")
    next_attempt(retry, extravars, attempts)
    return True


def print_detached(printer: Printer, argv: list[str], artifacts: Path) -> None:
    """What a detached launch says once the run started, after starting its watcher if it may be retried."""
    where = f"is submitted to Slurm as job {printer.slurm_job}" if printer.slurm_job else "is running on every node"
    print(f"run {printer.run_id} {where}, detached.")
    if retries := detached.retries_allowed(str(printer.run_id), artifacts):
        log = detached.watch_in_background(str(printer.run_id), argv, artifacts)
        print(f"  a watcher on this machine retries it (train_retries: {retries}) while this machine is up: {log}")
    print("From any terminal:")
    for command in ("status", "logs FOLLOW=1", "stop"):
        print(f"  make {command} RUN={printer.run_id}")


def next_attempt(retry: str, extravars: dict[str, Any], attempts: list[str]) -> None:
    """Says why the run is retried and sets the launch variables of the attempt after attempts: a run of its own,
    named after the first (its id says which attempt it is), resuming from the job's newest checkpoint."""
    print(f"  {retry}; retrying as attempt {len(attempts) + 1}, from the job's newest checkpoint", flush=True)
    extravars |= {"train_attempt": len(attempts) + 1, "train_resume": "auto"}
    extravars["train_run_tag"] = f"{extravars['train_run_tag'].split('-try')[0]}-try{len(attempts) + 1}"


def record_attempts(attempts: list[str], artifacts: Path) -> None:
    """Each attempt's run.json lists every attempt of the run, in order, with how each ended."""
    if len(attempts) < 2:
        return
    ended = []
    for run_id in attempts:
        record = json.loads((artifacts / run_id / "run.json").read_text())
        ended.append({key: record.get(key) for key in ("run_id", "status", "failed_node", "reason", "exit_code")})
    for run_id in attempts:
        run_files.record(artifacts / run_id, {"attempts": ended})
        run_report.write(artifacts / run_id)


def print_summary(run_id: str | None, artifacts: Path) -> None:
    """The ended run's outcome, from its run.json (a run refused before launch has none)."""
    try:
        run = control.find_run(run_id, artifacts) if run_id else None
    except LookupError:
        return
    for line in summary_lines(run.directory, run.record) if run else []:
        print(f"  {line}")


def cancel(run_id: str | None, artifacts: Path) -> None:
    """Ctrl-C or SIGTERM: stop the run everywhere, collect what exists, and mark it cancelled."""
    signal.signal(signal.SIGINT, lambda *_: print("  stopping the run; please wait", file=sys.stderr))
    record = artifacts / str(run_id) / "run.json"
    if run_id is None or not record.is_file():
        print("interrupted before any node started the run: nothing to stop")
        return
    print(f"interrupted: stopping run {run_id} on every node")
    control.stop(control.find_run(run_id, artifacts))


if __name__ == "__main__":
    sys.exit(main())
