"""Compare what every node reports about its GPU stack and lay it out as one table (role gpu_stack)."""

from __future__ import annotations

from collections import Counter
from typing import Any

MARK = "*"


def _reference(values: list[str]) -> str:
    """The value most nodes have; on a tie, the one the earliest node has (values are in node order)."""
    counts = Counter(values)
    top = max(counts.values())
    return next(value for value in values if counts[value] == top)


def gpu_stack_compare(rows: list[dict[str, Any]], columns: list[dict[str, str]]) -> dict[str, Any]:
    """rows: {node, scopes, values, wanted} per node, in play order; columns: {key, title, scope}.

    Returns the table (one string), the mismatches (a node's value differs from the column's reference) and the
    drift (a node's installed package version differs from the version its inventory asks for).
    """
    shown = [c for c in columns if any(c["scope"] in row["scopes"] for row in rows)]
    references: dict[str, str] = {}
    mismatches: list[str] = []
    for column in shown:
        in_scope = [row for row in rows if column["scope"] in row["scopes"]]
        values = [str(row["values"].get(column["key"], "unknown")) for row in in_scope]
        references[column["key"]] = reference = _reference(values)
        counts = Counter(values)
        if sum(1 for n in counts.values() if n == counts[reference]) == 1:
            how = f"{counts[reference]} of {len(values)} nodes"
        else:
            how = f"tie, taken from {in_scope[values.index(reference)]['node']}, the first node with it"
        mismatches.extend(
            f"{row['node']}: {column['title']} is {value}, reference {reference} ({how})"
            for row, value in zip(in_scope, values, strict=True)
            if value != reference
        )
    drift = [
        f"{row['node']}: {column['title']} is {row['values'].get(column['key'])}, its inventory asks for "
        f"{row['wanted'][column['key']]}"
        for column in shown
        for row in rows
        if column["key"] in row.get("wanted", {})
        and column["scope"] in row["scopes"]
        and str(row["values"].get(column["key"])) != str(row["wanted"][column["key"]])
    ]
    return {
        "table": _table(rows, shown, references),
        "mismatches": mismatches,
        "drift": drift,
    }


def _table(rows: list[dict[str, Any]], shown: list[dict[str, str]], references: dict[str, str]) -> str:
    if not shown:
        nodes = ", ".join(row["node"] for row in rows)
        return f"Nothing to compare on {nodes}: no node is expected to have a driver, CUDA or NCCL with a version set."
    header = ["node", *(c["title"] for c in shown)]
    body = []
    for row in rows:
        cells = [row["node"]]
        for column in shown:
            if column["scope"] not in row["scopes"]:
                cells.append("-")
                continue
            value = str(row["values"].get(column["key"], "unknown"))
            cells.append(value if value == references[column["key"]] else f"{value} {MARK}")
        body.append(cells)
    footer = ["reference", *(references[c["key"]] for c in shown)]
    widths = [max(len(line[i]) for line in [header, *body, footer]) for i in range(len(header))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    lines = [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, body), fmt(footer)]
    lines.append(
        f"{MARK} differs from the reference: the value most nodes have (on a tie, the first node's). "
        "- = not expected on that node."
    )
    return "\n".join(lines)


def gpu_stack_dpkg_summary(lines: list[str], packages: list[str]) -> str:
    """One version for a component from `dpkg-query --show` lines ("name version want status").

    "absent" when none of its packages is installed; the version when all are installed at one version; otherwise
    what is wrong (missing packages, or the differing versions).
    """
    installed: dict[str, str] = {}
    for line in lines:
        fields = line.split()
        if len(fields) == 4 and fields[3] == "installed" and fields[0] in packages:
            installed[fields[0]] = fields[1]
    if not installed:
        return "absent"
    versions = sorted(set(installed.values()))
    missing = [name for name in packages if name not in installed]
    if len(versions) > 1:
        return "mixed " + ",".join(f"{name}={version}" for name, version in sorted(installed.items()))
    return versions[0] + (f" (missing {','.join(missing)})" if missing else "")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpu_stack_compare": gpu_stack_compare, "gpu_stack_dpkg_summary": gpu_stack_dpkg_summary}
