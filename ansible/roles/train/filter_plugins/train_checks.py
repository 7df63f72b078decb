"""Filters behind the train role's inventory checks: decisions with a loop, kept out of Jinja and unit-tested."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# A job name or run id becomes a directory name on shared storage and on the controller.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


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


def unsafe_name(value: object) -> bool:
    """True when value cannot be used as a single directory name (empty, '/', '..', spaces, ...)."""
    text = str(value)
    return not SAFE_NAME.match(text) or ".." in text


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {
            "train_unknown_variables": unknown_variables,
            "train_spec_options": spec_options,
            "train_unsafe_name": unsafe_name,
        }
