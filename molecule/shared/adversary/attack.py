"""A job that tries to reach what is not its own, and records how each attempt ended in attempts-<node>-<rank>.json
in its work directory. It does nothing else and exits 0: the run must succeed and its artifacts hold only its own.

Usage: attack.py SECRET (a file only root may read, which must not reach the artifacts by any path)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def attempt(action) -> str:
    try:
        action()
    except OSError as error:
        return f"refused: {error.strerror}"
    return "done"


def rewrite_runners() -> dict[str, str]:
    """The node runner and the preflight, wherever the launch keeps a copy the job can see."""
    roots = [Path("/root/.ansible/tmp"), Path("/tmp"), Path("/var/tmp"), Path("~/.ansible/tmp").expanduser()]
    found: set[Path] = set()
    for root in roots:
        try:
            found.update(root.rglob("ddp_*.py"))
        except OSError:  # a directory this account may not list
            continue
    return {f"{path} (uid {path.stat().st_uid})": attempt(lambda p=path: p.open("a").write("#")) for path in found}


def plant_links(secret: str, node_dir: Path, me: str) -> dict[str, str]:
    """Links to the secret where the launch reads back: the node's log, its archive, and the work directory."""
    results = {}
    for name in ("node.log", "collected.tar"):
        target = node_dir / name
        aside = node_dir / f".{name}.link"

        def swap(target: Path = target, aside: Path = aside) -> None:
            aside.symlink_to(secret)
            aside.replace(target)

        results[str(target)] = attempt(swap)
    # Named by node and rank: every rank shares the work directory.
    results["work/leak (symlink)"] = attempt(lambda: Path(f"leak-{me}").symlink_to(secret))
    results["work/hardleak (hard link)"] = attempt(lambda: os.link(secret, f"hardleak-{me}"))
    return results


def write_other_runs(own_output: str) -> dict[str, str]:
    """A file in every other run's directory on shared storage (<shared>/ddp/<job>/runs/<run>, this run's too)."""
    jobs = Path(own_output).resolve().parents[2]
    others = [d for d in jobs.glob("*/runs/*") if d.resolve() != Path(own_output).resolve()]
    return {str(d): attempt(lambda d=d: (d / "intruder.txt").write_text("not yours\n")) for d in others}


def signal_others() -> list[str]:
    """Signal 0 to every process of another account: the kernel checks permission exactly as for SIGKILL."""
    reached = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == os.getuid():
                continue
            os.kill(int(entry.name), 0)
        except (OSError, ProcessLookupError):
            continue
        reached.append(entry.name)
    return reached


def main() -> int:
    secret = sys.argv[1]
    node = socket.gethostname()
    run = Path(os.environ["DDP_OUTPUT_DIR"]).name  # the work dir is the job's, kept from run to run
    me = f"{node}-{os.environ.get('LOCAL_RANK', '0')}-{run}"
    node_dir = Path("/proc/self/fd/1").readlink().parent  # the runner sends the job's output to its node.log
    attempts = {
        "node": node,
        "uid": os.getuid(),
        "read_secret": attempt(lambda: Path(secret).read_bytes()),
        "runners": rewrite_runners(),
        "links": plant_links(secret, node_dir, me),
        "other_runs": write_other_runs(os.environ["DDP_OUTPUT_DIR"]),
        "signalled_others": signal_others(),
    }
    Path(f"attempts-{me}.json").write_text(json.dumps(attempts, indent=1) + "\n")
    print(json.dumps(attempts), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
