"""Every value a command line interpolates is shell-quoted.

The command, shell, raw and script modules take one command line: the shell (shell, raw, script) or shlex
(command) splits it into words, so a value put in unquoted is split on its spaces and, under a shell, runs
whatever `;`, `$(...)` or glob it holds. Each `{{ ... }}` in such a line ends in `| quote` (a list of values:
`| map('quote') | join(' ')`), or is only a variable that quotes its own values (PRE_QUOTED below). A
`{% ... %}` in a command line is refused outright: what it puts in the line cannot be checked. `argv:` lists
pass each item as one word, unsplit, so they are not looked at.

Scanned: the roles' tasks/ and handlers/, the playbooks, and Molecule's scenario playbooks (SCANNED).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from _yaml_tasks import tasks_in
from jinja2 import Environment, TemplateSyntaxError, nodes

ROOT = Path(__file__).resolve().parents[2]
COMMAND_MODULES = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("command", "shell", "raw", "script")
)
# Where a module's mapping form keeps its command line (argv is a list of words, and safe).
COMMAND_KEYS = ("cmd", "_raw_params")
QUOTE_FILTERS = frozenset({"quote", "ansible.builtin.quote"})
JOIN_FILTERS = frozenset({"join", "ansible.builtin.join"})
MAP_FILTERS = frozenset({"map", "ansible.builtin.map"})

# Variables whose whole value is a command line that already quotes every value it takes in: an expression that
# is only one of these names passes. Each is checked below to be defined, and quoted, where its reason says.
PRE_QUOTED: dict[str, str] = {
    "__train_runner_cmd": (
        "ansible/roles/train/vars/main.yml: the node runner's command line, built with each value it takes in "
        "quoted (runner_args through map('quote') | join(' '))"
    ),
}

JINJA = Environment()


SCANNED = (
    "ansible/roles/*/tasks/**/*.yml",
    "ansible/roles/*/handlers/**/*.yml",
    "ansible/playbooks/**/*.yml",
    "ansible/roles/*/molecule/*/*.yml",
    "molecule/shared/*.yml",
    "site.yml",
)


def task_files() -> list[Path]:
    """Every task, handler and playbook file in SCANNED.

    Task files and playbooks are YAML lists; a vars file beside them (ansible/playbooks/vars/) is a mapping and
    holds no tasks, so it is left out (a variable named `shell` there is no shell task).
    """
    paths = sorted({path for pattern in SCANNED for path in ROOT.glob(pattern)})
    return [path for path in paths if isinstance(yaml.safe_load(path.read_text()), list)]


def command_lines(task: dict) -> Iterator[str]:
    """The command lines a task runs through a command-line module: free-form, or `cmd:` in its arguments."""
    for module in COMMAND_MODULES & task.keys():
        value = task[module]
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            yield from (value[key] for key in COMMAND_KEYS if isinstance(value.get(key), str))
        args = task.get("args")
        if isinstance(args, dict):
            yield from (args[key] for key in COMMAND_KEYS if isinstance(args.get(key), str))


def jinja_parts(line: str) -> Iterator[tuple[str, str]]:
    """Each `{{ ... }}` and `{% ... %}` in a line, as (kind, its text): kind is 'variable' or 'block'."""
    kind, text = None, ""
    for _, token, value in JINJA.lex(line):
        if token in ("variable_begin", "block_begin"):
            kind, text = token.removesuffix("_begin"), value
        elif kind is not None:
            text += value
            if token == f"{kind}_end":
                yield kind, text
                kind, text = None, ""


def is_quoted(expr: nodes.Node) -> bool:
    """Whether an expression's value reaches the command line shell-quoted."""
    if isinstance(expr, nodes.Name):
        return expr.name in PRE_QUOTED
    if not isinstance(expr, nodes.Filter):
        return False
    if expr.name in QUOTE_FILTERS:
        return True
    # values | map('quote') | join(' '): each value quoted, joined by whitespace into separate words.
    inner = expr.node
    return (
        expr.name in JOIN_FILTERS
        and len(expr.args) == 1
        and isinstance(separator := expr.args[0], nodes.Const)
        and isinstance(separator.value, str)
        and separator.value.strip() == ""
        and separator.value != ""
        and isinstance(inner, nodes.Filter)
        and inner.name in MAP_FILTERS
        and bool(inner.args)
        and isinstance(mapped := inner.args[0], nodes.Const)
        and mapped.value in QUOTE_FILTERS
    )


def unquoted_in(line: str) -> list[str]:
    """The Jinja in a command line that does not reach it quoted: `{{ ... }}` not quoted, and every `{% ... %}`."""
    try:
        parts = list(jinja_parts(line))
    except TemplateSyntaxError as error:
        return [f"unparsable Jinja ({error.message}): {line!r}"]
    problems = []
    for kind, text in parts:
        if kind == "block":
            problems.append(f"{text} (a Jinja block in a command line)")
            continue
        try:
            output = JINJA.parse(text).body[0]
        except TemplateSyntaxError as error:
            problems.append(f"{text} (unparsable: {error.message})")
            continue
        assert isinstance(output, nodes.Output)
        if not all(is_quoted(expr) for expr in output.nodes):
            problems.append(text)
    return problems


def offenders(node: object) -> list[str]:
    """Every unquoted interpolation in the command-line tasks of a loaded playbook or task list."""
    return [
        f"task {task.get('name', '(unnamed)')!r}: {problem}"
        for task in tasks_in(node)
        for line in command_lines(task)
        for problem in unquoted_in(line)
    ]


def test_every_command_line_quotes_what_it_interpolates() -> None:
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in task_files()
        for problem in offenders(yaml.safe_load(path.read_text()))
    ]
    assert not problems, "Unquoted interpolation in a command line (add `| quote`):\n" + "\n".join(problems)


def test_the_scan_sees_the_command_tasks() -> None:
    """The walk reaches the tasks it should: a silent miss would pass the check above on nothing."""
    lines = [
        line
        for path in task_files()
        for task in tasks_in(yaml.safe_load(path.read_text()))
        for line in command_lines(task)
    ]
    assert "{{ __train_runner_cmd }}" in lines
    assert len(lines) >= 10
    assert any(path.match("ansible/roles/*/handlers/main.yml") for path in task_files())
    assert any(path.match("ansible/playbooks/*.yml") for path in task_files())


@pytest.mark.parametrize("name", sorted(PRE_QUOTED))
def test_pre_quoted_variables_quote_their_values(name: str) -> None:
    definitions = {
        path.relative_to(ROOT).as_posix(): data[name]
        for path in sorted(ROOT.glob("ansible/roles/*/vars/*.yml"))
        if isinstance(data := yaml.safe_load(path.read_text()), dict) and name in data
    }
    assert len(definitions) == 1, f"{name}: defined in {sorted(definitions) or 'no vars file'}"
    ((where, value),) = definitions.items()
    assert PRE_QUOTED[name].startswith(f"{where}:"), f"{name} is defined in {where}"
    assert isinstance(value, str)
    assert list(jinja_parts(value)), f"{name} interpolates nothing: {value!r}"
    assert not unquoted_in(value), f"{name} in {where}: {unquoted_in(value)}"


def test_the_checker_fails_unquoted_and_passes_quoted() -> None:
    playbook = [
        {"name": "quoted", "ansible.builtin.command": "ls -- {{ path | quote }}"},
        {"name": "unquoted", "ansible.builtin.shell": "rm -rf {{ path }}"},
        {
            "name": "guarded",
            "block": [{"name": "list", "command": {"cmd": "ls {{ paths | map('quote') | join(' ') }}"}}],
            "rescue": [{"name": "in rescue", "ansible.builtin.raw": "echo {{ path | default('x') }}"}],
            "always": [{"name": "argv is safe", "ansible.builtin.command": {"argv": ["rm", "{{ path }}"]}}],
        },
        {"name": "pre-quoted", "ansible.builtin.script": {"cmd": "{{ __train_runner_cmd }}"}},
        {"name": "looped", "ansible.builtin.shell": "{% for p in paths %}rm {{ p | quote }};{% endfor %}"},
        {"name": "args cmd", "ansible.builtin.shell": None, "args": {"cmd": "cat {{ path }}"}},
    ]
    assert offenders(playbook) == [
        "task 'unquoted': {{ path }}",
        "task 'in rescue': {{ path | default('x') }}",
        "task 'looped': {% for p in paths %} (a Jinja block in a command line)",
        "task 'looped': {% endfor %} (a Jinja block in a command line)",
        "task 'args cmd': {{ path }}",
    ]
    assert offenders([playbook[0], playbook[3]]) == []


@pytest.mark.parametrize(
    ("line", "unquoted"),
    [
        ("ls {{ path | quote }}", []),
        ("ls {{ path|ansible.builtin.quote }}", []),
        ("ls {{ path | quote | upper }}", ["{{ path | quote | upper }}"]),
        ("ls {{ a if b else c | quote }}", ["{{ a if b else c | quote }}"]),
        ("ls {{ paths | map('quote') | join(';') }}", ["{{ paths | map('quote') | join(';') }}"]),
        ("ls {{ paths | map('quote') | join }}", ["{{ paths | map('quote') | join }}"]),
        ("ls {{ paths | join(' ') }}", ["{{ paths | join(' ') }}"]),
        ("ls {{ ({'a': 1} | to_json) | quote }}", []),
        ("ls {{ __train_runner_cmd ~ ' x' }}", ["{{ __train_runner_cmd ~ ' x' }}"]),
        ("ls /tmp", []),
    ],
)
def test_what_counts_as_quoted(line: str, unquoted: list[str]) -> None:
    assert unquoted_in(line) == unquoted
