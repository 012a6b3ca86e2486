"""Reading `tasks.yaml`: YAML -> validated `TaskFile`, or `ConfigError` listing every problem.

Each problem is one line naming the file, the task and the field::

    tasks.yaml: task 'daily-report': schedule.timezone: unknown timezone 'Mars/Base'
    tasks.yaml: task #3: agent: field required
    tasks.yaml: line 7: invalid YAML: mapping values are not allowed here
    tasks.yaml: upstreams.openai.limit: Input should be greater than or equal to 1

A task is labelled by its id when the id is valid, else by its 1-based position (`task #N`).
Tasks are validated one by one so that one bad task never hides another. Top-level keys other
than `tasks` and `upstreams` are errors, except `x-` keys, which hold YAML anchors for reuse.
Duplicate mapping keys, which YAML would silently collapse into the last one, are errors too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Final

import yaml
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from taskstream.core.errors import ConfigError
from taskstream.core.spec import (
    ID_PATTERN,
    TaskFile,
    TaskSpec,
    duplicate_ids,
    undeclared_upstreams,
)
from taskstream.core.spec_parts import Name, UpstreamLimit

_TOP_LEVEL_KEYS: Final = frozenset({"tasks", "upstreams"})
_ID: Final = re.compile(ID_PATTERN)
_UPSTREAMS: Final = TypeAdapter(dict[Name, UpstreamLimit])
_YAML_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


def load_task_file(path: Path, *, known_agents: AbstractSet[str] | None = None) -> TaskFile:
    """Read and validate `path`. With `known_agents`, every task's agent must be one of them.

    Raises `ConfigError` whose `problems` are one line each (see the module docstring).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read file: {exc.strerror or exc}"]) from None
    return parse_task_file_text(text, str(path), known_agents=known_agents)


def parse_task_file_text(
    text: str, source_name: str, known_agents: AbstractSet[str] | None = None
) -> TaskFile:
    """Validate YAML `text`; `source_name` starts every problem line. See `load_task_file`."""
    document, problems = _load_yaml(text, source_name)
    raw_tasks = _tasks_section(document, problems)
    if raw_tasks is None:
        raise ConfigError(_lines(source_name, problems))
    raw_upstreams = document.get("upstreams") if isinstance(document, dict) else None
    upstreams = _validate_upstreams(raw_upstreams, problems)
    declared = raw_upstreams if isinstance(raw_upstreams, Mapping) else {}
    specs = _validate_tasks(raw_tasks, known_agents, declared, problems)
    if problems:
        raise ConfigError(_lines(source_name, problems))
    return TaskFile(tasks=tuple(specs), upstreams=upstreams)


def _lines(source_name: str, problems: Sequence[str]) -> list[str]:
    """One line per problem, each starting with the file name."""
    return [f"{source_name}: {problem}".replace("\n", " ") for problem in problems]


def _load_yaml(text: str, source_name: str) -> tuple[object, list[str]]:
    """The document and its duplicate-key problems; a syntax error is raised at once."""
    try:
        document: object = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        reason = ", ".join(part for part in (exc.context, exc.problem) if part) or "cannot parse"
        raise ConfigError(_lines(source_name, [f"{where}invalid YAML: {reason}"])) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(_lines(source_name, [f"invalid YAML: {exc}"])) from None
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    duplicates = sorted(_duplicate_keys(root)) if root is not None else []
    return document, [f"line {line}: duplicate key '{key}'" for line, key in duplicates]


def _duplicate_keys(root: yaml.Node) -> Iterator[tuple[int, str]]:
    """(1-based line, key) of every key repeated inside one mapping, anywhere in the tree."""
    stack, visited = [root], set[int]()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                plain = isinstance(key, yaml.ScalarNode) and key.tag != _YAML_MERGE_TAG
                if plain and key.value in seen:
                    yield key.start_mark.line + 1, str(key.value)
                if plain:
                    seen.add(key.value)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _tasks_section(document: object, problems: list[str]) -> list[object] | None:
    """The raw task list, or None (with a problem) when the file's shape is wrong."""
    expected = "expected a mapping with a 'tasks' list"
    if document is None:
        problems.append(f"file is empty ({expected})")
        return None
    if not isinstance(document, dict):
        problems.append(f"top level is {_kind(document)} ({expected})")
        return None
    problems.extend(
        f"{key}: unknown field"
        for key in document
        if key not in _TOP_LEVEL_KEYS and not (isinstance(key, str) and key.startswith("x-"))
    )
    if "tasks" not in document:
        problems.append("tasks: field required")
        return None
    tasks = document["tasks"]
    if not isinstance(tasks, list):
        problems.append(f"tasks: must be a list of tasks, got {_kind(tasks)}")
        return None
    return tasks


def _validate_upstreams(raw: object, problems: list[str]) -> dict[str, UpstreamLimit]:
    if raw is None:
        return {}
    try:
        return _UPSTREAMS.validate_python(raw)
    except ValidationError as exc:
        problems.extend(_format_error(error, ("upstreams",)) for error in exc.errors())
        return {}


def _validate_tasks(
    raw_tasks: Sequence[object],
    known_agents: AbstractSet[str] | None,
    declared: Mapping[str, object],
    problems: list[str],
) -> list[TaskSpec]:
    """Valid specs in file order; problems of every task are appended, grouped by task."""
    ids = [_valid_id(item) for item in raw_tasks]
    repeats = duplicate_ids(ids)
    specs: list[TaskSpec] = []
    for n, item in enumerate(raw_tasks):
        label = f"task '{ids[n]}'" if ids[n] is not None else f"task #{n + 1}"
        spec, lines = _check_task(item, known_agents, declared)
        if n in repeats:
            lines.insert(0, f"id: duplicate id (first used by task #{repeats[n] + 1})")
        problems.extend(f"{label}: {line}" for line in lines)
        if spec is not None:
            specs.append(spec)
    return specs


def _check_task(
    item: object, known_agents: AbstractSet[str] | None, declared: Mapping[str, object]
) -> tuple[TaskSpec | None, list[str]]:
    """The spec (None when invalid) and the problem lines of one raw task, without its label."""
    if not isinstance(item, dict):
        return None, [f"must be a mapping, got {_kind(item)}"]
    spec: TaskSpec | None = None
    try:
        spec = TaskSpec.model_validate(item)
    except ValidationError as exc:
        lines = [_format_error(error) for error in exc.errors()]
    else:
        lines = [
            f"upstreams: undeclared upstream '{name}' (declared: {', '.join(sorted(declared))})"
            for name in undeclared_upstreams(spec, declared)
        ]
    agent = item.get("agent")
    if known_agents is not None and isinstance(agent, str) and agent not in known_agents:
        known = ", ".join(sorted(known_agents)) or "none"
        lines.append(f"agent: unknown agent '{agent}' (known: {known})")
    return (spec if not lines else None), lines


def _valid_id(item: object) -> str | None:
    task_id = item.get("id") if isinstance(item, dict) else None
    return task_id if isinstance(task_id, str) and _ID.fullmatch(task_id) else None


def _format_error(error: ErrorDetails, parent: tuple[str, ...] = ()) -> str:
    where = _dotted((*parent, *error["loc"]))
    return f"{where}: {_message(error)}" if where else _message(error)


def _dotted(loc: tuple[int | str, ...]) -> str:
    """`("calendar", "maintenance", 0, "start")` -> `calendar.maintenance[0].start`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += part
        else:
            out += f".{part}" if out else part
    return out


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "field required"
    cause = (error.get("ctx") or {}).get("error")
    if kind in {"value_error", "assertion_error"} and cause is not None:
        return str(cause)
    return error["msg"]


def _kind(value: object) -> str:
    """How a YAML value reads to a user: `a list`, `a str`, `nothing`."""
    return "nothing" if value is None else f"a {type(value).__name__}"
