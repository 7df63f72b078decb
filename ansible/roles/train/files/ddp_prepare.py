#!/usr/bin/env python3
"""Checks that one node can run its part of a run, in one call: run on every node at once, as the job's user.

    ddp_prepare.py SPEC_JSON

Prints one JSON object {"kind": "ddp_node.prepare/1", "problems": [...], "uid", "gid", "python", "machine", "glibc",
"torch", "venv_python", "image_id"} (python: the node's python3, which Ansible runs; venv_python: the job's);
the play fails on the first node with problems, before anything starts. Always exits 0 unless it crashes: the
problems are the answer. What SPEC_JSON may hold (train role, tasks/preflight.yml):

    node, runtime ("host" or "docker")           always
    venv                                         host runtime: its torch is the job's
    image, program_in_image                      docker runtime: the image must be here (and hold the program)
    required_files                               paths that must exist on this node (torchrun, the program)
    config_check                                 the master: a command that prints the program's resolved
                                                 config (--print-config) or refuses it, exiting non-zero
    node_dir, run_node_dir                       node_dir (train_node_dir) must be private to the job's user
                                                 (see loose_dirs); run_node_dir, this node's part of the run
                                                 inside it, must be new
    system_paths {dirs, trees}, shared_paths     each of shared_paths {variable: path}, resolved here, must be
                                                 none of system_paths' dirs and lie in none of its trees
    rendezvous {port, timeout, peers | master_addr}
    master_dirs                                  made by the master before any peer looks (job directories)
    fresh_dirs                                   the master: this run's own directories, which must be new
    writable_dirs                                each node writes and removes a marker there
    shared_dir, run_id                           with several nodes: every peer must see the master's marker
    deadline_s                                   the answer comes by then, naming what hung when it must

The rendezvous connection orders the nodes: the master makes its directories and its marker, then listens; a
peer that got through therefore finds them, checks them and answers one byte before the master tidies up.
With only `node`, `runtime` and `venv` or `image`, it reads the torch version alone (make doctor).

Standard library only: nodes need nothing but the python3 that Ansible already uses.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPORT = "ddp_node.prepare/1"
# The master's first byte to each peer: proof that the port's listener is this check, not some other program.
GREETING = b"D"
CONNECT_RETRY_S = 0.5  # pragma: no mutate (a retry pace: slower or busy, the same outcome)


def torch_in_venv(venv: str) -> str | None:
    """The venv's torch version, from its dist-info directory's name: importing torch would take seconds."""
    found = sorted(Path(venv).glob("lib/python3*/site-packages/torch-*.dist-info"))
    return found[-1].name[len("torch-") : -len(".dist-info")] if found else None


def venv_python(venv: str) -> str | None:
    """The venv's python version, from its pyvenv.cfg: the job's python, which the node's python3 need not be."""
    try:
        lines = Path(venv, "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    found = [
        line.split("=", 1)[1].strip()
        for line in lines
        if line.replace(" ", "").startswith(("version=", "version_info="))
    ]
    return found[0] if found else None


def inspect_image(image: str) -> tuple[str | None, str | None]:
    """(image id, its ddp.torch label) or (None, None) when the image is not on this node."""
    fmt = '{{.Id}} {{index .Config.Labels "ddp.torch"}}'
    argv = ["docker", "image", "inspect", "--format", fmt, image]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None, None
    image_id, _, label = done.stdout.strip().partition(" ")
    return image_id, (label if label and label != "<no value>" else None)


def check_runtime(spec: dict[str, Any], report: dict[str, Any]) -> list[str]:
    node, problems = spec["node"], []
    if spec["runtime"] == "docker":
        report["image_id"], report["torch"] = inspect_image(spec["image"])
        if report["image_id"] is None:
            return [
                f"host {node} lacks the training image {spec['image']} (train_image_name): run the container stage "
                "(ansible/playbooks/container.yml) first."
            ]
        inside = spec.get("program_in_image")
        if inside and not image_holds(report["image_id"], inside):
            problems.append(f"the image {spec['image']} on {node} has no {inside} (train_program).")
    else:
        report["torch"] = torch_in_venv(spec["venv"]) if spec.get("venv") else None
        report["venv_python"] = venv_python(spec["venv"]) if spec.get("venv") else None
    missing = [path for path in spec.get("required_files", []) if not Path(path).exists()]
    if missing:
        problems.append(f"host {node} lacks {', '.join(missing)} (see train_venv, train_program, train_config).")
    elif spec.get("config_check") and not problems:
        problems += check_config(node, spec["config_check"])
    return problems


def image_holds(image_id: str, path: str) -> bool:
    """Whether the image holds the file, asked by starting a container once per image id and path: an image id
    names its content, and a container's start is most of a launch's preflight on a slow node. Only a found file is
    remembered (in the job's user's cache), so a missing one is asked again after a fix."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddp-train" / "image-files"
    marker = cache / f"{image_id.removeprefix('sha256:')}-{hashlib.sha1(path.encode()).hexdigest()}"
    if marker.exists():
        return True
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "test", image_id, "-f", path]
    if subprocess.run(argv, capture_output=True, check=False).returncode != 0:
        return False
    with contextlib.suppress(OSError):  # no cache (a home that cannot be written): asked again next time
        cache.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return True


def check_config(node: str, argv: list[str]) -> list[str]:
    """The program's own verdict on its config: a typo fails here, naming the key, before any node starts."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return []
    said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    reason = next((line for line in said if "config error" in line), " | ".join(said[-3:]) or f"exit {done.returncode}")
    return [f"the training program refuses its config on {node} (train_program_args): {reason.strip()}"]


def loose_dirs(path: str, uid: int, gid: int) -> list[str]:
    """Each existing directory on the way to path, and path itself, that an account other than root and the job's
    user could change, written "dir (uid U, mode M)". Checked both as written and with links resolved; a link
    itself only needs a trusted owner. A root-owned world-writable directory with the sticky bit (/tmp) passes:
    nobody else can rename or remove what the job's user made in it, so it is the next step's owner that counts."""
    found: list[str] = []
    for route in (Path(path), Path(os.path.realpath(path))):
        for directory in [*reversed(route.parents), route]:
            try:
                info = os.lstat(directory)
            except FileNotFoundError:
                break  # the job's user makes the rest
            mode, trusted_owner = info.st_mode, info.st_uid in (0, uid)
            if stat.S_ISLNK(mode):
                loose = not trusted_owner
            else:
                group_writable = mode & stat.S_IWGRP and info.st_gid not in (0, gid)
                other_writable = mode & stat.S_IWOTH and not (mode & stat.S_ISVTX and info.st_uid == 0)
                loose = not trusted_owner or bool(group_writable) or bool(other_writable)
            entry = f"{directory} (uid {info.st_uid}, mode {stat.S_IMODE(mode):o})"
            if loose and entry not in found:
                found.append(entry)
    return found


def check_node_dir(spec: dict[str, Any]) -> list[str]:
    """The node directory holds what the runner reads back (the log, the exit code, the pids to signal): an
    account that can swap it could make the job's user read or signal what it chooses."""
    loose = loose_dirs(spec["node_dir"], os.getuid(), os.getgid())
    if not loose:
        return []
    return [
        f"train_node_dir {spec['node_dir']} on {spec['node']} is not private to {spec['user']}: "
        f"{', '.join(loose)} can be changed by another account, which could swap this run's files. Leave "
        f"train_node_dir empty (a directory in {spec['user']}'s home) or name one that only root and "
        f"{spec['user']} can write."
    ]


def check_shared_paths(spec: dict[str, Any]) -> list[str]:
    """A path that is written as /data but is a link to /etc is /etc: the rule is applied to where it leads."""
    dirs, trees = spec["system_paths"]["dirs"], spec["system_paths"]["trees"]
    problems = []
    for name, path in spec.get("shared_paths", {}).items():
        real = os.path.realpath(path)
        if real in dirs or any(real.startswith(tree + "/") for tree in trees):
            problems.append(
                f"{name}={path} on {spec['node']} resolves to {real}, a system directory: the job would write "
                "its files there. Use a directory of its own, e.g. /data or /srv/ddp."
            )
    return problems


def reused(spec: dict[str, Any], directory: str) -> str:
    return (
        f"run id {spec['run_id']} was used before: {directory} exists on {spec['node']}, and a reused id would mix "
        "two runs' files. Leave train_run_id empty for a fresh one."
    )


def make_private(directory: Path) -> None:
    """mkdir -p with every directory it makes 0711 (Path.mkdir gives only the last one its mode): what the job
    keeps on shared storage is for its user alone to list and read, yet root on a node, squashed to nobody by
    the NFS server, can still pass through to mount the work dir into the job's container."""
    missing = [directory, *directory.parents]
    for step in reversed(missing[: next(i for i, d in enumerate(missing) if d.exists())]):
        step.mkdir(mode=0o711, exist_ok=True)
    if not directory.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(directory))


def make_dirs(spec: dict[str, Any]) -> list[str]:
    """The master makes the job's directories on shared storage, as the job's user; this run's own must be new."""
    taken = [directory for directory in spec.get("fresh_dirs", []) if Path(directory).exists()]
    if taken:
        return [reused(spec, taken[0])]
    for directory in spec.get("master_dirs", []):
        try:
            make_private(Path(directory))
        except OSError as error:
            return [f"host {spec['node']} cannot create {directory} as user {spec['user']} ({error.strerror})."]
    return []


def check_writable(spec: dict[str, Any]) -> list[str]:
    """Every directory written and emptied again as the job's user: a read-only export, root squashing or another
    owner shows up here instead of as a failed checkpoint after launch."""
    failed = []
    for directory in spec.get("writable_dirs", []):
        marker = Path(directory) / f".write-check-{spec['run_id']}-{spec['node']}"
        try:
            marker.write_text(spec["node"] + "\n")
            marker.unlink()
        except OSError as error:
            failed.append((directory, error.strerror or str(error)))
    if not failed:
        return []
    names = " and ".join(directory for directory, _ in failed)
    return [
        f"host {spec['node']} cannot write to {names} as user {spec['user']} ({failed[0][1]}): the job saves "
        f"checkpoints and status there. Check the export is read-write, the mount is not read-only and "
        f"{spec['user']} owns the directory (nfs_server_user, cluster_user)."
    ]


def shared_marker(spec: dict[str, Any]) -> Path:
    return Path(spec["shared_dir"]) / f".shared-check-{spec['run_id']}"


def peer_sees_master(spec: dict[str, Any]) -> list[str]:
    if "shared_dir" not in spec or shared_marker(spec).exists():
        return []
    return [
        f"host {spec['node']} does not see {spec['shared_dir']} as the master {spec['master']} does: with "
        f"{spec['nnodes']} nodes it must be on storage every node shares (train_shared_dir / shared_dir, e.g. the "
        "NFS mount)."
    ]


def serve_rendezvous(spec: dict[str, Any], deadline: float) -> list[str]:
    """The master: the port must be free; every peer connects and answers once it has checked its side."""
    port, peers = spec["rendezvous"]["port"], spec["rendezvous"]["peers"]
    try:
        server = socket.create_server(("", port), reuse_port=False)
    except OSError as error:
        return [f"rendezvous port {port} is not free on the master: {error}"]
    with server:
        for seen in range(peers):
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                connection = server.accept()[0]
            except TimeoutError:
                return [f"only {seen} of {peers} peers reached port {port}"]
            with connection:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    connection.sendall(GREETING)
                    connection.recv(1)  # the peer's checks are done (or it gave up): the marker may go
                except OSError:
                    pass  # the peer names its own trouble
    return []


def _greeted(connection: socket.socket) -> bool:
    try:
        return connection.recv(len(GREETING)) == GREETING
    except OSError:
        return False


def reach_rendezvous(spec: dict[str, Any], deadline: float) -> tuple[socket.socket | None, list[str]]:
    """A peer: connects to the master's port, retrying until the deadline."""
    where = (spec["rendezvous"]["master_addr"], spec["rendezvous"]["port"])
    error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection(where, timeout=2), []
        except OSError as err:
            error = err
            time.sleep(CONNECT_RETRY_S)
    return None, [f"cannot reach the master's rendezvous port {where[0]}:{where[1]}: {error}"]


def make_run_node_dir(spec: dict[str, Any]) -> list[str]:
    """Private to the job's user: the log and the pids to signal are read back from here."""
    try:
        Path(spec["run_node_dir"]).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        Path(spec["run_node_dir"]).mkdir(mode=0o700)
    except FileExistsError:
        return [reused(spec, spec["run_node_dir"])]
    except OSError as error:
        return [f"host {spec['node']} cannot create {spec['run_node_dir']} as {spec['user']} ({error})."]
    return []


def prepare(spec: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "kind": REPORT,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "glibc": platform.libc_ver()[1],
        "torch": None,
        "image_id": None,
    }
    # Where the job's files would go is judged before anything is made there.
    unsafe = (check_shared_paths(spec) if spec.get("shared_paths") else []) + (
        check_node_dir(spec) if spec.get("node_dir") else []
    )
    problems = unsafe + check_runtime(spec, report)
    if spec.get("run_node_dir") and not unsafe:
        problems += make_run_node_dir(spec)
    rendezvous = spec.get("rendezvous")
    if rendezvous is None:  # the runtime alone (make doctor), or a run under Slurm
        if spec.get("master_dirs") and not unsafe:
            # Under Slurm a running job may hold the rendezvous port: the master's directories are made, and the
            # port is the batch job's, which has the nodes to itself when it starts.
            problems += make_dirs(spec) + check_writable(spec)
        report["problems"] = problems
        return report
    deadline = time.monotonic() + rendezvous["timeout"]
    if "master_addr" not in rendezvous:  # the master
        if not unsafe:
            problems += make_dirs(spec)
            problems += check_writable(spec)
        if "shared_dir" in spec and not unsafe:
            shared_marker(spec).write_text(spec["run_id"] + "\n")
        try:
            problems += serve_rendezvous(spec, deadline)
        finally:
            if "shared_dir" in spec:
                shared_marker(spec).unlink(missing_ok=True)
    else:
        connection, unreachable = reach_rendezvous(spec, deadline)
        problems += unreachable
        if connection is not None:
            with connection:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                # Something other than this check holds the port when no greeting comes: the master says so.
                if _greeted(connection):
                    if not unsafe:
                        problems += check_writable(spec) + peer_sees_master(spec)
                    connection.sendall(b"1")
    report["problems"] = problems
    return report


def watchdog(spec: dict[str, Any]) -> None:
    """Answers with one problem, naming what the check waited on, once deadline_s have passed: a hard NFS mount
    whose server stopped answering holds a system call for as long as it takes, and Ansible's own timeout would
    say only that the task took too long."""

    def expire() -> None:
        time.sleep(spec["deadline_s"])
        touched = ", ".join(dict.fromkeys(spec.get("writable_dirs", []) + spec.get("master_dirs", [])))
        problem = (
            f"the preflight on {spec['node']} did not finish within {spec['deadline_s']:.0f} s; it reads and writes "
            f"{touched or 'its node directory'} as user {spec['user']}: is that mount hung there (NFS server down, or "
            "the firewall)? Check with findmnt and ls on the node."
        )
        print(json.dumps({"kind": REPORT, "problems": [problem]}), flush=True)
        os._exit(0)

    threading.Thread(target=expire, daemon=True).start()  # pragma: no mutate (daemon: it must not hold the exit)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(args[0])
    if spec.get("deadline_s"):
        watchdog(spec)
    print(json.dumps(prepare(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
