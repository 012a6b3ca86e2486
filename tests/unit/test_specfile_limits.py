"""Task files that PyYAML alone would expand, recurse on, or hand back as text that is not
Unicode, and payloads over the size limit: each is one problem line naming the file and where,
never a traceback or a hang."""

from __future__ import annotations

import pytest

from taskstream.core.errors import ConfigError
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.records import stored_json, utf8_size

AGENTS = {"echo"}
LIMIT = 1024
MAX_DEPTH = 100  # taskstream.core.specyaml.MAX_DEPTH, spelled out as the docs state it


def problems_of(text: str, max_payload_bytes: int | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(
            text, "t.yaml", known_agents=AGENTS, max_payload_bytes=max_payload_bytes
        )
    return caught.value.problems


def one_task(payload_yaml: str, extra: str = "") -> str:
    return f"tasks:\n  - id: a\n    agent: echo\n{extra}    payload: {payload_yaml}\n"


# --- payload size -------------------------------------------------------------------------


def test_a_payload_over_the_limit_names_the_task_and_both_sizes() -> None:
    text = one_task('{blob: "' + "x" * 2000 + '"}')
    assert problems_of(text, max_payload_bytes=LIMIT) == [
        "t.yaml: task 'a': payload: 2011 bytes as stored JSON, over the limit of 1024 bytes "
        "(TASKSTREAM_MAX_PAYLOAD_BYTES)"
    ]


def test_the_limit_is_on_utf8_bytes_of_the_stored_json_as_the_executor_measures() -> None:
    payload = {"blob": "é" * 200}  # 200 characters, 400 bytes
    size = utf8_size(stored_json(payload))
    assert size == 411
    at_limit = parse_task_file_text(
        one_task('{blob: "' + "é" * 200 + '"}'), "t.yaml", max_payload_bytes=size
    )
    assert at_limit.tasks[0].payload == payload
    [line] = problems_of(one_task('{blob: "' + "é" * 200 + '"}'), max_payload_bytes=size - 1)
    assert f"payload: {size} bytes as stored JSON, over the limit of {size - 1} bytes" in line


# --- alias bombs --------------------------------------------------------------------------


def laughs(levels: int, width: int) -> str:
    """A "billion laughs" file: each anchor lists `width` aliases of the one before."""
    lines = ["x-a: &a [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        name, before = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"x-{name}: &{name} [" + ", ".join([f"*{before}"] * width) + "]")
    return "\n".join(lines) + "\n" + one_task(f"{{p: *{chr(ord('a') + levels - 1)}}}")


@pytest.mark.parametrize(("levels", "width"), [(5, 10), (9, 9)])
def test_an_alias_bomb_is_refused_naming_the_bound(levels: int, width: int) -> None:
    [line] = problems_of(laughs(levels, width))
    assert line.startswith("t.yaml: line ")
    assert "expanding aliases would add more than 100000 nodes" in line
    assert "aliases may add at most 100000 nodes and 10000000 characters" in line


def test_aliasing_a_long_string_many_times_is_refused_by_characters() -> None:
    text = f'x-s: &s "{"y" * 100_000}"\n' + one_task("{p: [" + ", ".join(["*s"] * 200) + "]}")
    [line] = problems_of(text)
    assert line.startswith("t.yaml: line 5: expanding aliases would add more than 10000000 char")


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    assert problems_of("x-a: &a [*a]\n" + one_task("{p: *a}")) == [
        "t.yaml: line 1: alias *a is inside its own anchor &a (recursive structures are not "
        "allowed)"
    ]


def test_aliases_within_the_bound_still_share_settings() -> None:
    shared = "x-p: &p {" + ", ".join(f"k{n}: {n}" for n in range(50)) + "}\n"
    tasks = "".join(f"  - {{id: t{n}, agent: echo, payload: *p}}\n" for n in range(100))
    taskfile = parse_task_file_text(shared + "tasks:\n" + tasks, "t.yaml")
    assert len(taskfile.tasks) == 100
    assert taskfile.tasks[99].payload["k49"] == 49


# --- lone surrogates ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            one_task('{msg: "a\\ud800b"}'),
            "line 4: tasks[0].payload.msg: the value holds the lone surrogate '\\ud800'",
        ),
        (
            one_task('{list: [ok, "\\U0000DC80"]}'),
            "line 4: tasks[0].payload.list[1]: the value holds the lone surrogate '\\udc80'",
        ),
        (
            one_task('{"k\\udfff": 1}'),
            "line 4: tasks[0].payload: a key holds the lone surrogate '\\udfff'",
        ),
        (
            one_task("{}", extra='    dedupe_key: "{task_id}\\ud834"\n'),
            "line 4: tasks[0].dedupe_key: the value holds the lone surrogate '\\ud834'",
        ),
    ],
)
def test_a_lone_surrogate_names_the_line_and_the_field(text: str, expected: str) -> None:
    [line] = problems_of(text)
    assert line.startswith(f"t.yaml: {expected}, which is not Unicode text")
    line.encode("utf-8")  # printable: no surrogate of the file leaks into the message


# --- nesting depth ------------------------------------------------------------------------


def test_deep_nesting_is_refused_with_the_bound() -> None:
    text = "tasks: " + "[" * 100_000 + "]" * 100_000 + "\n"
    assert problems_of(text) == [
        f"t.yaml: line 1: nested more than {MAX_DEPTH} levels deep (the most allowed)"
    ]


def test_nesting_up_to_the_bound_loads() -> None:
    # levels: top mapping, tasks, the task, payload, then the lists; the scalar is the last
    lists = MAX_DEPTH - 5
    payload = "{p: " + "[" * lists + "1" + "]" * lists + "}"
    parse_task_file_text(one_task(payload), "t.yaml")
    [line] = problems_of(one_task("{p: " + "[" * (lists + 1) + "1" + "]" * (lists + 1) + "}"))
    assert line.startswith("t.yaml: line 4: nested more than")


# --- values the loader cannot build --------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-02-30", "invalid date or time '2026-02-30': day is out of range for month"),
        ("2026-13-01 10:00:00Z", "invalid date or time '2026-13-01 10:00:00Z': month must be"),
        ("!!timestamp tomorrow", "invalid date or time 'tomorrow': not a date or time"),
    ],
)
def test_an_invalid_date_names_the_line(value: str, expected: str) -> None:
    text = (
        "tasks:\n  - id: a\n    agent: echo\n    schedule: {cron: '0 9 * * *', timezone: UTC}\n"
        f"    calendar:\n      exclude_dates:\n        - 2026-01-01\n        - {value}\n"
    )
    [line] = problems_of(text)
    assert line.startswith(f"t.yaml: line 8: {expected}")


def test_an_overlong_integer_names_the_line() -> None:
    [line] = problems_of(one_task("{n: " + "1" * 5000 + "}"))
    assert line.startswith("t.yaml: line 4: invalid integer '111")
    assert "Exceeds the limit (4300 digits)" in line
    assert "sys.set_int_max_str_digits" not in line


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("!!bool maybe", "invalid boolean 'maybe': not a boolean"),
        ("!!timestamp soon", "invalid date or time 'soon': not a date or time"),
    ],
)
def test_a_tagged_value_its_tag_cannot_build_names_the_line(value: str, expected: str) -> None:
    """PyYAML's constructors for these tags fail with a KeyError or an AttributeError on a
    value they cannot read: a traceback, not a problem line."""
    [line] = problems_of(one_task(f"{{x: {value}}}"))
    assert line == f"t.yaml: line 4: {expected}"
