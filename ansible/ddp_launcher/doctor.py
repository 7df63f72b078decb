"""`make doctor`: is this cluster fit to train? Measures it and says what is wrong, and why.

    ddp doctor [--inventory inventory/local] [--artifacts DIR] [--extra-vars VARS ...]

1. Every training node (ansible/playbooks/doctor.yml): python, torch, NVIDIA driver/CUDA/NCCL packages, the
   interfaces NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name in train_env; TCP bandwidth and latency (iperf3)
   for every ordered pair of nodes, on a port of the firewall's open data range.
2. An allreduce sweep across all nodes and processes through the same launch as training (train.yml running
   train/bench_allreduce.py: gloo on CPU, nccl with GPUs), algbw/busbw per size.
3. The known failure patterns in the newest training run's node logs, each with its cause and fix.
Verdicts against the usual hand checks: 1 MB allreduce under 5 ms, 100 MB under 100 ms on a 10 Gbit/s or
faster link (scaled in proportion on a slower one), busbw as a fraction of the pair bandwidth, the same
versions everywhere. Writes <artifacts>/doctor-<time>/doctor.json and report.md and prints the table.
Exits 1 when a verdict is FAIL (training would stop or be wrong), else 0: a WARN is advice (slower than it
should be), printed but not failing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import control

ROOT = control.ROOT
DOCTOR_PLAYBOOK = ROOT / "ansible" / "playbooks" / "doctor.yml"
TRAIN_PLAYBOOK = ROOT / "ansible" / "playbooks" / "train.yml"
# The 100 MB allreduce limit holds for links of this speed or faster; slower links get a proportionally longer one.
REFERENCE_LINK_GBIT = 10.0
SMALL, LARGE = 1 << 20, 100 << 20
SMALL_LIMIT_MS, LARGE_LIMIT_MS = 5.0, 100.0
# Ethernet should carry about this share of its line rate (iperf3) as allreduce bus bandwidth.
BUSBW_SHARE_EXPECTED = 0.5

# Known lines in node logs: (pattern, cause, fix).
LOG_PATTERNS = [
    (r"Connect(ion)? timed? ?out|connect timeout", "network or firewall between nodes",
     "make doctor's pair table shows which link; open the data port range (firewall role) between the nodes"),
    (r"CUDA error.*driver version|driver version is insufficient", "NVIDIA driver older than the CUDA runtime",
     "pin one driver on every node (gpu_stack_driver_version) and rerun site.yml"),
    (r"NCCL version mismatch|NCCL.*version.*mismatch", "different NCCL on the nodes",
     "pin one NCCL (gpu_stack_nccl_version) everywhere; check_versions.yml names the odd node"),
    (r"Connection refused", "a peer's rendezvous store or process group port closed",
     "check the master's rendezvous port and that every node runs the same run (make status)"),
    (r"No route to host|Network is unreachable", "no IP route between the nodes",
     "check cluster_address and the nodes' routes; set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to that interface"),
    (r"address already in use|EADDRINUSE", "a port clash on a node", "free the rendezvous port or pick another"),
    (r"out of memory|CUDA out of memory|Killed process", "memory exhausted", "smaller batch_size, or fewer procs"),
]  # fmt: skip


@dataclass
class Verdict:
    check: str
    verdict: str  # PASS, FAIL, WARN, INFO
    detail: str


def _gbyte(gbit: float) -> float:
    return gbit / 8


def large_limit_ms(link_gbit: float | None) -> float:
    """The 100 MB allreduce limit on this link: 100 ms at 10 Gbit/s or more, proportionally longer below."""
    if not link_gbit:
        return LARGE_LIMIT_MS
    return LARGE_LIMIT_MS * max(1.0, REFERENCE_LINK_GBIT / link_gbit)


def node_verdicts(nodes: dict[str, dict[str, Any]]) -> list[Verdict]:
    verdicts = []
    for field in ("python", "torch"):
        seen = {name: node.get(field) for name, node in nodes.items()}
        same = len(set(seen.values())) == 1
        detail = ", ".join(f"{name} {value}" for name, value in sorted(seen.items()))
        verdicts.append(Verdict(f"{field} version", "PASS" if same else "FAIL", detail))
    packages = {name: sorted(node.get("packages") or []) for name, node in nodes.items()}
    if any(packages.values()):
        same = len({tuple(p) for p in packages.values()}) == 1
        detail = "; ".join(f"{name}: {' '.join(p) or 'none'}" for name, p in sorted(packages.items()))
        verdicts.append(Verdict("driver/CUDA/NCCL packages", "PASS" if same else "FAIL", detail))
    else:
        verdicts.append(Verdict("driver/CUDA/NCCL packages", "INFO", "none installed on any node (CPU nodes)"))
    for name, node in sorted(nodes.items()):
        problems = node.get("interface_problems") or []
        detail = "; ".join(problems) or "as train_env names them"
        verdicts.append(Verdict(f"interfaces on {name}", "FAIL" if problems else "PASS", detail))
        if not node.get("iperf3"):
            verdicts.append(Verdict(f"iperf3 on {name}", "WARN", "not installed: apt-get install iperf3"))
    return verdicts


def pair_verdicts(pairs: list[dict[str, Any]]) -> list[Verdict]:
    verdicts = []
    for pair in pairs:
        name = f"TCP {pair['client']} -> {pair['server']}"
        measured = pair.get("iperf3") or {}
        if "error" in measured:
            cause = " (blocked: firewall or routing?)" if "timed out" in measured["error"].lower() else ""
            verdicts.append(Verdict(name, "FAIL", f"port {pair['port']}: {measured['error']}{cause}"))
        else:
            rtt = measured.get("mean_rtt_ms")
            detail = f"{measured['gbit_per_s']:.2f} Gbit/s, rtt {'-' if rtt is None else f'{rtt:.2f} ms'}"
            verdicts.append(Verdict(name, "INFO", detail))
    return verdicts


def link_gbit(pairs: list[dict[str, Any]]) -> float | None:
    """The slowest measured pair: what an allreduce across all nodes is bound by."""
    speeds = [p["iperf3"]["gbit_per_s"] for p in pairs if "gbit_per_s" in (p.get("iperf3") or {})]
    return min(speeds) if speeds else None


def allreduce_verdicts(bench: dict[str, Any], link: float | None) -> list[Verdict]:
    results = {r["size_bytes"]: r for r in bench.get("results", [])}
    verdicts = []
    if link and link < REFERENCE_LINK_GBIT:
        scaled = f"scaled from 100 ms at {REFERENCE_LINK_GBIT:.0f} Gbit/s to the measured {link:.2f} Gbit/s"
    else:
        scaled = (
            f"the measured {link:.2f} Gbit/s is at least {REFERENCE_LINK_GBIT:.0f} Gbit/s: unscaled" if link else ""
        )
    for size, reference_ms, link_note in ((SMALL, SMALL_LIMIT_MS, ""), (LARGE, large_limit_ms(link), scaled)):
        row = results.get(size) or min(results.values(), key=lambda r: abs(r["size_bytes"] - size), default=None)
        if row is None:
            continue
        # The sweep's sizes are powers of two: the nearest one's limit grows with its size (time ~ bytes there).
        ratio = row["size_bytes"] / size
        limit_ms = reference_ms * ratio
        notes = [f"{reference_ms:.0f} ms for {size >> 20} MiB x {ratio:.2f}"] if ratio != 1 else []
        why = ", ".join([*notes, link_note] if link_note else notes)
        ms = row["time_us"] / 1000
        verdict = "PASS" if ms < limit_ms and row["correct"] else "FAIL"
        detail = f"{row['size']}: {ms:.1f} ms (limit {limit_ms:.0f} ms{'; ' + why if why else ''}), "
        detail += f"busbw {row['busbw_gbps']:.2f} GB/s"
        verdicts.append(Verdict(f"allreduce {row['size']}", verdict, detail))
    big = max(results.values(), key=lambda r: r["size_bytes"], default=None)
    if big and link:
        # The verdict compares the number it shows, so that the words never contradict it ("50%, expected 50%").
        share_pct = round(100 * big["busbw_gbps"] / _gbyte(link), 1)
        verdict = "PASS" if share_pct >= 100 * BUSBW_SHARE_EXPECTED else "WARN"
        detail = f"busbw {big['busbw_gbps']:.2f} GB/s at {big['size']} = {share_pct:.1f}% of the slowest pair's "
        detail += f"{_gbyte(link):.2f} GB/s (expected at least {100 * BUSBW_SHARE_EXPECTED:.1f}%)"
        verdicts.append(Verdict("allreduce busbw / link", verdict, detail))
    return verdicts


def log_verdicts(artifacts: Path) -> list[Verdict]:
    """Known failure patterns in the newest training run's node logs."""
    runs = [run for run in control.all_runs(artifacts) if run.record and not run.run_id.startswith("doctor-")]
    if not runs:
        return [Verdict("known failures in logs", "INFO", "no training run yet")]
    run = runs[-1]
    found = []
    for log in sorted(run.directory.glob("logs/*/node.log")):
        text = log.read_text(errors="replace")
        for pattern, cause, fix in LOG_PATTERNS:
            if re.search(pattern, text, re.IGNORECASE):
                found.append(Verdict(f"log of {log.parent.name} ({run.run_id})", "WARN", f"{cause}: {fix}"))
    return found or [Verdict("known failures in logs", "PASS", f"none in {run.run_id}")]


def table(verdicts: list[Verdict]) -> list[str]:
    width = max(len(v.check) for v in verdicts)
    return [f"{v.verdict:<5} {v.check:<{width}}  {v.detail}" for v in verdicts]


def report_md(verdicts: list[Verdict], bench: dict[str, Any]) -> str:
    lines = ["# make doctor", "", "| verdict | check | detail |", "|---|---|---|"]
    lines += [f"| {v.verdict} | {v.check} | {v.detail} |" for v in verdicts]
    if bench.get("results"):
        lines += ["", "## Allreduce sweep", "", "| size | time (us) | algbw (GB/s) | busbw (GB/s) |"]
        lines += ["|---|---|---|---|"]
        lines += [
            f"| {r['size']} | {r['time_us']:.0f} | {r['algbw_gbps']:.3f} | {r['busbw_gbps']:.3f} |"
            for r in bench["results"]
        ]
    return "\n".join(lines) + "\n"


def run_allreduce(inventory: str, artifacts: Path, run_id: str, link: float | None, cmdline: str | None) -> dict:
    """bench_allreduce.py on every node through train.yml; its JSON comes back with the run's metrics."""
    args = ["--max-bytes", "128M", "--json", "{{ train_output_dir }}/allreduce.json", "--time-budget-s", "0.5"]
    args += ["--threshold", f"1M:{SMALL_LIMIT_MS:g}", "--threshold", f"100M:{large_limit_ms(link):g}"]
    extravars = {
        "train_job_name": "doctor",
        "train_run_id": run_id,
        "train_program": "{{ train_code_dir }}/bench_allreduce.py",
        "train_program_args": args,
        "train_artifacts_dir": str(artifacts),
    }
    runner = control.run_playbook(TRAIN_PLAYBOOK, inventory, extravars, lambda _: None, cmdline=cmdline)
    result = artifacts / run_id / "metrics" / "allreduce.json"
    if runner.rc != 0 or not result.is_file():
        return {"error": f"the allreduce run {run_id} failed: see {artifacts / run_id}"}
    return json.loads(result.read_text())


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--inventory", default="inventory/local")
    parser.add_argument("--artifacts", type=Path, default=control.ARTIFACTS)
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS")
    args = parser.parse_args(argv)
    inventory = str((ROOT / args.inventory).resolve())
    artifacts = args.artifacts.resolve()
    doctor_id = time.strftime("doctor-%Y%m%d-%H%M%S", time.gmtime())
    out = artifacts / doctor_id
    out.mkdir(parents=True, exist_ok=True)
    cmdline = control.extra_vars_cmdline(args.extra_vars) or None

    print(f"- examining every node and every pair of nodes ({doctor_id})", flush=True)
    extravars = {"train_run_id": doctor_id, "train_artifacts_dir": str(artifacts)}
    runner = control.run_playbook(DOCTOR_PLAYBOOK, inventory, extravars, lambda _: None, cmdline=cmdline)
    (out / "doctor-ansible.log").write_text(runner.output)
    if runner.rc != 0 or not (out / "nodes.json").is_file():
        print(f"make doctor: the examination failed; see {out / 'doctor-ansible.log'}", file=sys.stderr)
        return 2
    examined = json.loads((out / "nodes.json").read_text())
    verdicts = node_verdicts(examined["nodes"]) + pair_verdicts(examined["pairs"])
    link = link_gbit(examined["pairs"])

    bench: dict[str, Any] = {}
    if any(v.verdict == "FAIL" and v.check.startswith("interfaces") for v in verdicts):
        verdicts.append(Verdict("allreduce", "FAIL", "not run: fix the interfaces named above first"))
    else:
        print("- allreduce sweep across every node and process (train/bench_allreduce.py)", flush=True)
        bench = run_allreduce(inventory, artifacts, f"{doctor_id}-allreduce", link, cmdline)
        if "error" in bench:
            verdicts.append(Verdict("allreduce", "FAIL", bench["error"]))
        else:
            verdicts += allreduce_verdicts(bench, link)
    verdicts += log_verdicts(artifacts)

    summary = {"id": doctor_id, "link_gbit_per_s": link, **examined, "allreduce": bench}
    summary["verdicts"] = [asdict(v) for v in verdicts]
    (out / "doctor.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(report_md(verdicts, bench))
    print("\n".join(table(verdicts)))
    print(f"doctor.json and report.md: {out}")
    # A FAIL stops training or makes it wrong; a WARN is advice (slow, not broken), so only a FAIL fails.
    failed = sum(v.verdict == "FAIL" for v in verdicts)
    warned = sum(v.verdict == "WARN" for v in verdicts)
    print(f"{failed} FAIL, {warned} WARN: " + ("not fit to train" if failed else "fit to train"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
