"""Every role's meta/argument_specs.yml and defaults/main.yml tell the same story, and every role README's
variable table is the one generated from the spec.

- every variable in defaults/main.yml is an option of the `main` entry point;
- an option with a spec `default:` has that very value (compared as YAML) in defaults/main.yml; an option
  without one has, in defaults/main.yml, either nothing, a Jinja template (which a spec cannot state), or a
  placeholder for a `required: true` option that the stage playbook passes in;
- a literal default has the spec's type;
- a variable that several roles read (train_image_name: train_image builds the image, train runs it) has one
  default in all of them;
- every option, nested ones included, of every entry point has a description;
- in the roles converted so far (issue #18), every name a task registers or sets is internal (`__<role>_*`, as
  linux-system-roles do) unless the README's "Results other plays read" names it as public.

The README tables are written by this file:  .venv/bin/python tests/unit/test_role_specs.py --write
"""

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = ROOT / "ansible" / "roles"
ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "meta" / "argument_specs.yml").is_file())
# Roles whose README.md someone else owns and has not written yet; every other role must have one.
README_PENDING: set[str] = set()

BEGIN = "<!-- BEGIN GENERATED: role variables (tests/unit/test_role_specs.py --write) -->"
END = "<!-- END GENERATED: role variables -->"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Python types a literal default of each argument-spec type may have.
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "path": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


def _load(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)


def specs(role: str) -> dict[str, Any]:
    """The entry points of a role's meta/argument_specs.yml."""
    return _load(ROLES_DIR / role / "meta" / "argument_specs.yml")["argument_specs"]


def defaults(role: str) -> dict[str, Any]:
    path = ROLES_DIR / role / "defaults" / "main.yml"
    return (_load(path) or {}) if path.is_file() else {}


def is_template(value: Any) -> bool:
    """True when a value holds a Jinja expression anywhere (a string, or inside a list or dict)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list):
        return any(is_template(v) for v in value)
    if isinstance(value, dict):
        return any(is_template(v) for v in value.values())
    return False


def _walk(options: dict[str, Any], prefix: str = ""):
    """(dotted name, spec) of every option, nested options after their parent."""
    for name, spec in (options or {}).items():
        full = f"{prefix}{name}"
        yield full, spec
        if spec.get("options"):
            suffix = "[]." if spec.get("type") == "list" else "."
            yield from _walk(spec["options"], full + suffix)


# --- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_an_option_of_main(role):
    options = specs(role)["main"].get("options") or {}
    missing = sorted(set(defaults(role)) - set(options))
    assert not missing, f"{role}: in defaults/main.yml but not in meta/argument_specs.yml (main): {missing}"


@pytest.mark.parametrize("role", ROLES)
def test_spec_defaults_equal_role_defaults(role):
    options = specs(role)["main"].get("options") or {}
    role_defaults = defaults(role)
    problems = []
    for name, spec in options.items():
        if "default" in spec:
            if name not in role_defaults:
                problems.append(f"{name}: spec default {spec['default']!r}, absent from defaults/main.yml")
            elif role_defaults[name] != spec["default"]:
                problems.append(
                    f"{name}: spec default {spec['default']!r} != defaults/main.yml {role_defaults[name]!r}"
                )
        elif name in role_defaults and not is_template(role_defaults[name]) and not spec.get("required"):
            problems.append(f"{name}: defaults/main.yml has {role_defaults[name]!r}, the spec no default")
    assert not problems, f"{role}: meta/argument_specs.yml and defaults/main.yml disagree:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("role", ROLES)
def test_literal_defaults_have_the_spec_type(role):
    options = specs(role)["main"].get("options") or {}
    problems = []
    for name, value in defaults(role).items():
        kind = options[name].get("type", "str") if name in options else None  # not in the spec: tested above
        if kind in _TYPES and not is_template(value):
            ok = isinstance(value, _TYPES[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
            if not ok:
                problems.append(f"{name}: {value!r} is not a {kind}")
    assert not problems, f"{role}: defaults/main.yml values of the wrong type: {problems}"


def test_a_variable_of_several_roles_has_one_default():
    by_name: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        for name, value in defaults(role).items():
            by_name.setdefault(name, {})[role] = value
    differing = {
        name: by_role
        for name, by_role in by_name.items()
        if any(value != next(iter(by_role.values())) for value in by_role.values())
    }
    assert not differing, f"one variable, different defaults in different roles: {differing}"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_is_documented(role):
    undocumented = [
        f"{entry}: {name}"
        for entry, spec in specs(role).items()
        for name, option in _walk(spec.get("options") or {})
        if not _text(option.get("description"))
    ]
    assert not undocumented, f"{role}: options without a description in meta/argument_specs.yml: {undocumented}"


@pytest.mark.parametrize("role", [r for r in ROLES if r not in README_PENDING])
def test_role_has_a_readme_with_the_generated_table(role):
    readme = ROLES_DIR / role / "README.md"
    assert readme.is_file(), f"{role}: no README.md"
    assert BEGIN in readme.read_text(encoding="utf-8"), f"{role}: README.md lacks the generated variable table"


@pytest.mark.parametrize("role", [r for r in ROLES if (ROLES_DIR / r / "README.md").is_file()])
def test_readme_variable_table_is_current(role):
    text = (ROLES_DIR / role / "README.md").read_text(encoding="utf-8")
    assert text == render_readme(role, text), (
        f"{role}: README.md's variable table differs from meta/argument_specs.yml; "
        "regenerate it with: .venv/bin/python tests/unit/test_role_specs.py --write"
    )


RESULTS_HEADING = "## Results other plays read"


def _set_names(tasks: Any) -> set[str]:
    """Every name the tasks (blocks included) register or set with set_fact."""
    names: set[str] = set()
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for section in ("block", "rescue", "always"):
            names |= _set_names(task.get(section))
        if "register" in task:
            names.add(task["register"])
        for module in ("set_fact", "ansible.builtin.set_fact"):
            if isinstance(task.get(module), dict):
                names |= set(task[module]) - {"cacheable"}
    return names


def role_set_names(role: str) -> set[str]:
    files = sorted((ROLES_DIR / role).glob("tasks/*.yml")) + sorted((ROLES_DIR / role).glob("handlers/*.yml"))
    return set().union(*(_set_names(_load(path)) for path in files))


def readme_results(role: str) -> set[str]:
    """The public names the README's "Results other plays read" section lists (in backticks)."""
    text = (ROLES_DIR / role / "README.md").read_text(encoding="utf-8")
    section = text.partition(RESULTS_HEADING)[2].split("\n## ")[0]
    return {name for name in re.findall(r"`([a-z0-9_]+)`", section) if name.startswith(f"{role}_")}


@pytest.mark.parametrize("role", ROLES)
def test_registered_and_set_names_are_internal_unless_the_readme_makes_them_public(role):
    names = role_set_names(role)
    public = {name for name in names if not name.startswith(f"__{role}_")}
    listed = readme_results(role)
    assert public <= listed, (
        f"{role}: {sorted(public - listed)} registered or set under a public name; rename it __{role}_* or list it "
        f'under "{RESULTS_HEADING}" in its README'
    )
    assert listed <= names, f"{role}: README lists {sorted(listed - names)} as results, but no task sets them"


# --- the README table --------------------------------------------------------------------------------------


def _text(description: Any) -> str:
    if isinstance(description, list):
        return " ".join(str(d).strip() for d in description)
    return str(description or "").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _inline(value: Any) -> str:
    if isinstance(value, str):
        plain = yaml.safe_dump(value, width=1 << 16).strip().removesuffix("...").strip()
        return value if is_template(value) or plain == value else json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()


def _default_cell(spec: dict[str, Any], fallback: dict[str, Any], name: str) -> str:
    if "default" in spec:
        return f"`{_cell(_inline(spec['default']))}`"
    if spec.get("required"):
        return "*required*"
    if name in fallback:
        return f"`{_cell(_inline(fallback[name]))}`"
    return ""


def variables_table(role: str) -> str:
    """The generated block (markers included) for a role's README."""
    entry_points = specs(role)
    role_defaults = defaults(role)
    options = list(_walk(entry_points["main"].get("options") or {}))
    required = any(spec.get("required") and "." not in name for name, spec in options)
    lines = [
        BEGIN,
        "Generated from [`meta/argument_specs.yml`](meta/argument_specs.yml); each knob is commented in",
        "[`defaults/main.yml`](defaults/main.yml)."
        + (" *required*: set it yourself (this project's stage playbooks do)." if required else ""),
        "",
    ]
    if len(entry_points) > 1:
        main_options = entry_points["main"].get("options")
        same = all(spec.get("options") == main_options for spec in entry_points.values())
        lines.append("Entry points" + (", all with the options below:" if same else ":"))
        lines.append("")
        lines += [f"- `{name}`: {_text(spec.get('short_description'))}" for name, spec in entry_points.items()]
        lines.append("")
    lines += ["| variable | type | default | description |", "|---|---|---|---|"]
    for name, spec in options:
        kind = spec.get("type", "str") + (f" of {spec['elements']}" if spec.get("elements") else "")
        description = _text(spec.get("description"))
        if spec.get("choices"):
            description += " One of: " + ", ".join(f"`{c}`" for c in spec["choices"]) + "."
        default = _default_cell(spec, role_defaults if "." not in name else {}, name)
        lines.append(f"| `{name}` | {kind} | {default} | {_cell(description)} |")
    lines.append(END)
    return "\n".join(lines)


def render_readme(role: str, text: str) -> str:
    """text with its generated block replaced by the current one (unchanged when it has no block)."""
    if BEGIN not in text or END not in text:
        return text
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + variables_table(role) + tail


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: test_role_specs.py --write   (rewrites the variable table of every role README)")
        return 2
    for role in ROLES:
        readme = ROLES_DIR / role / "README.md"
        if readme.is_file():
            text = readme.read_text(encoding="utf-8")
            new = render_readme(role, text)
            if new != text:
                readme.write_text(new, encoding="utf-8")
                print(f"updated {readme.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# --- dependencies ------------------------------------------------------------------------------------------

SHARED_FILTERS = ROOT / "ansible" / "plugins" / "filter" / "ddp_validators.py"


def shared_plugins_used(role: str) -> set[str]:
    """The project's shared filters and modules (outside the role) that the role's tasks, templates, vars and own
    plugins use."""
    shared = set(re.findall(r'"(ddp_[a-z_]+)":', SHARED_FILTERS.read_text()))
    shared |= {path.stem for path in (ROOT / "ansible" / "plugins" / "modules").glob("ddp_*.py")}
    # The launcher package's modules, which a role may run on the controller (ddp_launcher.artifacts).
    shared |= {f"ddp_launcher.{path.stem}" for path in (ROOT / "ansible" / "ddp_launcher").glob("[a-z]*.py")}
    text = " ".join(
        path.read_text()
        for sub in ("tasks", "templates", "vars", "action_plugins", "library", "filter_plugins")
        for path in (ROLES_DIR / role).glob(f"{sub}/*")
        if path.is_file()
    )
    return {name for name in shared if re.search(rf"\b{re.escape(name)}\b", text)}


@pytest.mark.parametrize("role", ROLES)
def test_the_readme_declares_every_shared_plugin_the_role_uses(role):
    readme = (ROLES_DIR / role / "README.md").read_text(encoding="utf-8")
    dependencies = readme.partition("## Dependencies")[2].split("\n## ")[0]
    undeclared = sorted(name for name in shared_plugins_used(role) if f"`{name}`" not in dependencies and
                        f"{name}.py" not in dependencies)  # fmt: skip
    assert not undeclared, f"{role} uses {undeclared} from ansible/plugins/ without its README saying so"


def test_the_dependency_scan_sees_the_shared_plugins():
    assert {"ddp_gpus", "ddp_versions_problems"} <= shared_plugins_used("gpu_stack")
    assert "ddp_launcher.artifacts" in shared_plugins_used("train")
