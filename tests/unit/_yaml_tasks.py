"""Walking the tasks of a playbook or task file as YAML, for tests that check what the files say."""

from collections.abc import Iterator

# Where tasks nest: a block's parts and a play's task lists.
NESTED = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")


def tasks_in(node: object) -> Iterator[dict]:
    """Every mapping in a loaded playbook or task file, plays and blocks included, depth first."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_in(item)
    elif isinstance(node, dict):
        yield node
        for key in NESTED:
            yield from tasks_in(node.get(key))
