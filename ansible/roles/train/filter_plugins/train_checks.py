"""Filters behind the train role's checks and verdicts: decisions with a loop, kept out of Jinja and unit-tested."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable


def unknown_variables(given: Iterable[str], known: Iterable[str], prefix: str = "train_") -> list[str]:
    """One message per name in `given` with the prefix that no role declares, naming the closest known one."""
    known = sorted(set(known))
    public = [name for name in known if name.startswith(prefix)]
    messages = []
    for name in sorted(set(given)):
        if not name.startswith(prefix) or name in known:
            continue
        closest = difflib.get_close_matches(name, public, n=1, cutoff=0.6)
        hint = f" (did you mean {closest[0]}?)" if closest else ""
        messages.append(f"{name}: no such variable{hint}")
    return messages


def spec_options(argument_specs: dict, entry_point: str = "main") -> list[str]:
    """The option names one entry point of a role's meta/argument_specs.yml declares."""
    return sorted(argument_specs["argument_specs"][entry_point].get("options", {}))


# Lines that say what went wrong first, in the order torchrun's ranks print them; torchrun's own summary of a
# failed child ("ChildFailedError", "Root Cause") repeats them later and is not the cause.
ERROR_LINE = re.compile(r"(error|exception|traceback|killed|refused|timed? ?out)", re.IGNORECASE)
TORCHRUN_BOILERPLATE = re.compile(r"(ChildFailedError|torch\.distributed\.elastic|^\s*File \"|^=+$|Root Cause)")


def first_error_line(log: str) -> str | None:
    """The first line of a node's log that names an error, not counting torchrun's failure report."""
    for line in log.splitlines():
        if ERROR_LINE.search(line) and not TORCHRUN_BOILERPLATE.search(line) and not line.startswith("Traceback"):
            return line.strip()
    return None


def outcome(
    polled: list[dict], ended: list[dict], lost: list[str], broken: dict[str, str], stop_requested: bool = False
) -> dict[str, object]:
    """How a run ended, from the nodes' poll reports during the run (polled) and after every node stopped
    (ended), the hosts that vanished (lost) and the hosts whose part broke down in the play (broken).
    status is succeeded, failed (with the node that broke the run and why) or cancelled (stopped on request,
    or every node ended by a stop)."""
    failed_polled = [r for r in polled if r.get("job") == "failed"]
    failed_ended = [r for r in ended if r.get("job") == "failed"]
    # A heartbeat or the ranks' progress that stopped while every node still ran is the cause (the stop that
    # follows ends every node alike). Otherwise trust what the nodes report once all have stopped: while a run
    # breaks down, a peer's failure can show before its cause.
    silent_reasons = ("no heartbeat", "never started", "no progress", "no new metrics")
    silent = failed_polled and failed_polled[0]["reason"].startswith(silent_reasons)
    failed = failed_polled if silent else failed_ended or failed_polled
    if lost:  # a node that vanished is the cause; what its peers report is the consequence
        return {"status": "failed", "node": lost[0], "reason": "unreachable during the run"}
    if failed:
        first = failed[0]
        code = {"exit_code": first["exit_code"]} if "exit_code" in first else {}
        return {"status": "failed", "node": first["failed_node"], "reason": first["reason"], **code}
    if broken:
        node = sorted(broken)[0]
        return {"status": "failed", "node": node, "reason": broken[node]}
    jobs = {r.get("job") for r in ended}
    if jobs == {"succeeded"}:
        return {"status": "succeeded"}
    if stop_requested or jobs == {"stopped"}:
        return {"status": "cancelled"}
    return {"status": "failed", "node": None, "reason": f"the nodes report the job {'/'.join(sorted(map(str, jobs)))}"}


def node_pairs(nodes: list[str]) -> list[list[str]]:
    """Every ordered pair of distinct nodes (each link measured both ways); one node is paired with itself."""
    if len(nodes) == 1:
        return [[nodes[0], nodes[0]]]
    return [[a, b] for a in nodes for b in nodes if a != b]


def iperf3_summary(output: str) -> dict[str, object]:
    """The numbers `make doctor` uses from `iperf3 --json` (receiver side), or the error iperf3 reported."""
    try:
        result = json.loads(output) if output.strip() else {}
    except json.JSONDecodeError:
        return {"error": f"iperf3 printed no JSON: {output.strip()[:200]}"}
    if not result:
        return {"error": "not measured (iperf3 missing on a node)"}
    if result.get("error"):
        return {"error": result["error"]}
    end = result.get("end", {})
    sender = (end.get("streams") or [{}])[0].get("sender", {})
    received = end.get("sum_received", {})
    return {
        "gbit_per_s": round(received.get("bits_per_second", 0) / 1e9, 3),
        "mean_rtt_ms": round(sender["mean_rtt"] / 1000, 3) if "mean_rtt" in sender else None,
        "retransmits": end.get("sum_sent", {}).get("retransmits"),
    }


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "train_unknown_variables": unknown_variables,
            "train_spec_options": spec_options,
            "train_first_error_line": first_error_line,
            "train_outcome": outcome,
            "train_node_pairs": node_pairs,
            "train_iperf3_summary": iperf3_summary,
        }
