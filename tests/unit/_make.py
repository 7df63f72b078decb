"""`make train` and the run commands as a user types them, on inventory/local, from the repository root."""

import json
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


def make(*words: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *words], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def make_train(*assignments: str) -> tuple[subprocess.CompletedProcess, str | None]:
    """`make train ...` and the id of the run it started (None when it was refused before launch)."""
    done = make("train", *assignments)
    found = re.search(r"run (\S+?)(?::| is running)", done.stdout)
    return done, found.group(1) if found else None


def run_record(run_id: str) -> dict:
    return json.loads((ARTIFACTS / run_id / "run.json").read_text())


def node_log(run_id: str, node: str = "localhost") -> str:
    return (ARTIFACTS / run_id / "logs" / node / "node.log").read_text()


def processes_of(run_id: str) -> str:
    """Command lines of any process of the run's job still running (torchrun names it in --rdzv-id); not the
    controller's drawing of the run's report, which ends once its plots are in (finished_report)."""
    found = subprocess.run(["pgrep", "-af", run_id], capture_output=True, text=True, check=False).stdout
    return "\n".join(line for line in found.splitlines() if not ("pgrep" in line or "-m ddp_launcher.report" in line))


def finished_report(run_dir: Path, timeout_s: float = 60) -> str:
    """A run's report.html once its plots are in: a run's end writes the tables first and draws the plots after."""
    from ddp_launcher.report import PLOTS_PENDING

    deadline = time.monotonic() + timeout_s
    while PLOTS_PENDING in (page := (run_dir / "report.html").read_text()):
        assert time.monotonic() < deadline, f"{run_dir}/report.html still waits for its plots after {timeout_s} s"
        time.sleep(0.1)
    return page
