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
The YAML itself is read within bounds (nesting depth, alias expansion, valid Unicode; see
`taskstream.core.specyaml`). Given `max_payload_bytes`, a task's payload larger than that as
stored JSON is an error too (see `taskstream.core.payloads`)::

    tasks.yaml: task 'big': payload: 300011 bytes as stored JSON, over the limit of 262144 bytes ...

Given `known_checks` (the precondition names the configured modules provide), a task naming
any other precondition is an error too, as an unknown agent is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from taskstream.core.errors import ConfigError
from taskstream.core.payloads import payload_problem
from taskstream.core.spec import (
    ID_PATTERN,
    TaskFile,
    TaskSpec,
    duplicate_ids,
    undeclared_upstreams,
)
from taskstream.core.spec_parts import Name, Schedule
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.core.specyaml import problem_lines, read_document

_TOP_LEVEL_KEYS: Final = frozenset({"tasks", "upstreams"})
_ID: Final = re.compile(ID_PATTERN)
_UPSTREAMS: Final = TypeAdapter(dict[Name, UpstreamLimit])


@dataclass(frozen=True, slots=True)
class _Rules:
    """What each task is checked against besides its own model; None checks nothing."""

    known_agents: AbstractSet[str] | None
    declared: Mapping[str, object]
    max_payload_bytes: int | None
    known_checks: AbstractSet[str] | None = None


def load_task_file(
    path: Path,
    *,
    known_agents: AbstractSet[str] | None = None,
    max_payload_bytes: int | None = None,
    known_checks: AbstractSet[str] | None = None,
) -> TaskFile:
    """Read and validate `path`. With `known_agents`, every task's agent must be one of them;
    with `known_checks`, every precondition a task names must be one of them; with
    `max_payload_bytes`, every task's payload must fit in that many bytes as stored JSON.

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
    return parse_task_file_text(
        text,
        str(path),
        known_agents=known_agents,
        max_payload_bytes=max_payload_bytes,
        known_checks=known_checks,
    )


def parse_task_file_text(
    text: str,
    source_name: str,
    known_agents: AbstractSet[str] | None = None,
    max_payload_bytes: int | None = None,
    known_checks: AbstractSet[str] | None = None,
) -> TaskFile:
    """Validate YAML `text`; `source_name` starts every problem line. See `load_task_file`."""
    document, problems = read_document(text, source_name)
    raw_tasks = _tasks_section(document, problems)
    if raw_tasks is None:
        raise ConfigError(problem_lines(source_name, problems))
    raw_upstreams = document.get("upstreams") if isinstance(document, dict) else None
    upstreams = _validate_upstreams(raw_upstreams, problems)
    declared = raw_upstreams if isinstance(raw_upstreams, Mapping) else {}
    rules = _Rules(known_agents, declared, max_payload_bytes, known_checks)
    specs = _validate_tasks(raw_tasks, rules, problems)
    if problems:
        raise ConfigError(problem_lines(source_name, problems))
    return TaskFile(tasks=tuple(specs), upstreams=upstreams)


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
    raw_tasks: Sequence[object], rules: _Rules, problems: list[str]
) -> list[TaskSpec]:
    """Valid specs in file order; problems of every task are appended, grouped by task."""
    ids = [_valid_id(item) for item in raw_tasks]
    repeats = duplicate_ids(ids)
    specs: list[TaskSpec] = []
    for n, item in enumerate(raw_tasks):
        label = f"task '{ids[n]}'" if ids[n] is not None else f"task #{n + 1}"
        spec, lines = _check_task(item, rules)
        if n in repeats:
            lines.insert(0, f"id: duplicate id (first used by task #{repeats[n] + 1})")
        problems.extend(f"{label}: {line}" for line in lines)
        if spec is not None:
            specs.append(spec)
    return specs


def _check_task(item: object, rules: _Rules) -> tuple[TaskSpec | None, list[str]]:
    """The spec (None when invalid) and the problem lines of one raw task, without its label."""
    if not isinstance(item, dict):
        return None, [f"must be a mapping, got {_kind(item)}"]
    spec: TaskSpec | None = None
    try:
        spec = TaskSpec.model_validate(item)
    except ValidationError as exc:
        lines = [_format_error(error) for error in exc.errors()]
    else:
        lines = _spec_problems(spec, rules)
    agent, known_agents = item.get("agent"), rules.known_agents
    if known_agents is not None and isinstance(agent, str) and agent not in known_agents:
        known = ", ".join(sorted(known_agents)) or "none"
        lines.append(f"agent: unknown agent '{agent}' (known: {known})")
    return (spec if not lines else None), lines


def _spec_problems(spec: TaskSpec, rules: _Rules) -> list[str]:
    """Problems of a task valid on its own: schedule fields its kind never reads,
    undeclared upstreams, preconditions no module provides, an oversize payload."""
    declared = ", ".join(sorted(rules.declared))
    lines = _unread_schedule_fields(spec.schedule)
    lines.extend(
        f"upstreams: undeclared upstream '{name}' (declared: {declared})"
        for name in undeclared_upstreams(spec, rules.declared)
    )
    if rules.known_checks is not None:
        lines.extend(unknown_check_lines(spec.preconditions, rules.known_checks))
    if rules.max_payload_bytes is not None:
        too_big = payload_problem(spec.payload, rules.max_payload_bytes)
        if too_big is not None:
            lines.append(f"payload: {too_big}")
    return lines


_NO_DST = {
    "every": "an every schedule counts UTC intervals, which daylight saving never moves",
    "on_demand": "an on-demand task has no fire times",
}


def _unread_schedule_fields(schedule: Schedule | None) -> list[str]:
    """Fields the file wrote that this kind of schedule never reads: `dst` without `cron`.
    Files only: the stored form of every spec holds `dst`, its defaults at least."""
    if schedule is None or "dst" not in schedule.model_fields_set or schedule.kind == "cron":
        return []
    return [f"schedule.dst: applies to cron only ({_NO_DST[schedule.kind]}): remove it"]


def unknown_check_lines(names: Sequence[str], known: AbstractSet[str]) -> list[str]:
    """One problem line per precondition name that no loaded module provides."""
    listed = ", ".join(sorted(known)) or "none: set TASKSTREAM_PRECONDITION_MODULES"
    return [
        f"preconditions: unknown precondition '{name}' (known: {listed})"
        for name in names
        if name not in known
    ]


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
