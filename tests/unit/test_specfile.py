"""Reading tasks.yaml: every problem is one line naming the file, the task and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskstream.core.definitions import from_record, to_records
from taskstream.core.errors import ConfigError
from taskstream.core.spec import TaskFile
from taskstream.core.specfile import load_task_file, parse_task_file_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tasks.yaml"
BAD = ROOT / "tests" / "fixtures" / "bad_tasks.yaml"
AGENTS = {"echo", "sleep"}


def problems_of(text: str, known_agents: set[str] | None = AGENTS) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(text, "t.yaml", known_agents=known_agents)
    return caught.value.problems


def test_example_file_loads() -> None:
    taskfile = load_task_file(EXAMPLE, known_agents=AGENTS)
    by_id = {spec.id: spec for spec in taskfile.tasks}
    assert list(by_id) == ["heartbeat", "daily-report", "nap"]
    heartbeat, report, nap = by_id.values()
    assert heartbeat.agent == "echo" and heartbeat.schedule is not None
    assert heartbeat.schedule.every == 10.0
    assert report.schedule is not None
    assert (report.schedule.cron, report.schedule.timezone) == ("0 9 * * *", "Europe/Berlin")
    assert nap.agent == "sleep" and nap.payload == {"seconds": 0.1}
    assert nap.schedule is not None and nap.schedule.cron_has_seconds


BAD_LINES = [
    ("bad-cron", "schedule.cron", "invalid cron expression '61 * * * *'"),
    ("bad-timezone", "schedule.timezone", "unknown timezone 'Mars/Base'"),
    ("unknown-field", "retry.attempts_max", "unknown field"),
    ("no-agent", "agent", "field required"),
]


def test_bad_file_yields_exactly_four_lines() -> None:
    with pytest.raises(ConfigError) as caught:
        load_task_file(BAD, known_agents=AGENTS)
    lines = caught.value.problems
    assert len(lines) == len(BAD_LINES)
    for line, (task_id, field, message) in zip(lines, BAD_LINES, strict=True):
        assert line.startswith(f"{BAD}: task '{task_id}': {field}: {message}")
        assert "\n" not in line


EXPECTED = "(expected a mapping with a 'tasks' list)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", [f"file is empty {EXPECTED}"]),
        ("# nothing\n", [f"file is empty {EXPECTED}"]),
        ("- id: a\n", [f"top level is a list {EXPECTED}"]),
        ("jobs: []\n", ["jobs: unknown field", "tasks: field required"]),
        ("tasks:\n", ["tasks: must be a list of tasks, got nothing"]),
        ("tasks: {id: a}\n", ["tasks: must be a list of tasks, got a dict"]),
        (
            "tasks: [\n",
            [
                "line 2: invalid YAML: while parsing a flow node, "
                "expected the node content, but found '<stream end>'"
            ],
        ),
        (
            "tasks:\n  - id: a\n   agent: echo\n",
            [
                "line 3: invalid YAML: while parsing a block collection, "
                "expected <block end>, but found '<block mapping start>'"
            ],
        ),
        (
            'tasks:\n  - id: a\n    agent: echo\n    payload: {m: "\x1b]0;x\x07"}\n',
            [
                "line 4: invalid YAML: unacceptable character #x1b "
                "(special characters are not allowed)"
            ],
        ),
        (
            "tasks: []\n\x00",
            [
                "line 2: invalid YAML: unacceptable character #x00 "
                "(special characters are not allowed)"
            ],
        ),
        (
            "tasks: []\n---\ntasks: []\n",
            [
                "line 2: invalid YAML: expected a single document in the stream, "
                "but found another document"
            ],
        ),
    ],
)
def test_file_level_problems(text: str, expected: list[str]) -> None:
    assert problems_of(text) == [f"t.yaml: {line}" for line in expected]


@pytest.mark.parametrize(
    ("tasks_yaml", "expected"),
    [
        ("- echo", ["task #1: must be a mapping, got a str"]),
        ("- {agent: echo}", ["task #1: id: field required"]),
        ("- {id: 'bad id', agent: echo}", ["task #1: id: String should match pattern"]),
        (
            "- {id: a, agent: mailer}",
            ["task 'a': agent: unknown agent 'mailer' (known: echo, sleep)"],
        ),
        ("- {id: a, agent: echo, timeout: soon}", ["task 'a': timeout: invalid duration 'soon'"]),
        (
            "- {id: a, agent: echo, calendar: {maintenance: [{start: '1:00', end: 1:00}]}}",
            ["task 'a': calendar.maintenance[0].end: expected a quoted \"HH:MM\" string"],
        ),
        (
            "- {id: a, agent: echo}\n- {id: b, agent: echo}\n- {id: a, agent: echo}",
            ["task 'a': id: duplicate id (first used by task #1)"],
        ),
        ("- {id: a, agent: echo, timeout: 1s, timeout: 2s}", ["line 2: duplicate key 'timeout'"]),
        (
            "- {id: a, <<: {agent: echo}, <<: {agent: sleep}}",
            ["line 2: duplicate key '<<' (merge several mappings with <<: [*a, *b])"],
        ),
        (
            "- {id: a, agent: echo, retry: {max_attempts: true}}",
            ["task 'a': retry.max_attempts: expected a number, got true"],
        ),
        (
            "- {id: a, agent: echo, review: false, retry: {jitter: true, backoff: {factor: no}}}",
            [
                "task 'a': retry.backoff.factor: expected a number, got false",
                "task 'a': retry.jitter: expected a number, got true",
                "task 'a': review: expected a number, got false",
            ],
        ),
        (
            "- {id: a, agent: mailer, dedupe_key: '{x}', colour: red}",
            [
                "task 'a': dedupe_key: unknown placeholder {x}",
                "task 'a': colour: unknown field",
                "task 'a': agent: unknown agent 'mailer'",
            ],
        ),
    ],
)
def test_task_problems(tasks_yaml: str, expected: list[str]) -> None:
    lines = problems_of("tasks:\n" + tasks_yaml + "\n")
    assert len(lines) == len(expected)
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"t.yaml: {start}")


def test_one_bad_task_does_not_hide_another() -> None:
    text = "tasks:\n- {id: a, agent: echo, every: 1m}\n- {id: b}\n- {id: c, agent: echo}\n"
    assert problems_of(text) == [
        "t.yaml: task 'a': every: unknown field",
        "t.yaml: task 'b': agent: field required",
    ]


def test_agents_are_not_checked_without_a_known_list() -> None:
    taskfile = parse_task_file_text("tasks: [{id: a, agent: anything}]", "t.yaml")
    assert taskfile.tasks[0].agent == "anything"


GATED = "tasks: [{id: a, agent: echo, preconditions: [warehouse.open, feed.fresh]}]"


def test_a_precondition_no_module_provides_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(GATED, "t.yaml", known_checks={"warehouse.open", "other"})
    assert caught.value.problems == [
        "t.yaml: task 'a': preconditions: unknown precondition 'feed.fresh'"
        " (known: other, warehouse.open)"
    ]


def test_with_no_precondition_module_the_error_says_how_to_load_one() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(GATED, "t.yaml", known_checks=set())
    assert caught.value.problems == [
        f"t.yaml: task 'a': preconditions: unknown precondition '{name}'"
        " (known: none: set TASKSTREAM_PRECONDITION_MODULES)"
        for name in ("warehouse.open", "feed.fresh")
    ]


def test_preconditions_are_checked_only_against_a_known_list() -> None:
    known = {"warehouse.open", "feed.fresh"}
    for checks in (known, None):
        [task] = parse_task_file_text(GATED, "t.yaml", known_checks=checks).tasks
        assert task.preconditions == ("warehouse.open", "feed.fresh")


UPSTREAMS = """
upstreams:
  openai: {limit: 60, window: 1m, burst: 5}
tasks:
  - {id: a, agent: echo, upstreams: [openai]}
"""


def test_declared_upstreams_load() -> None:
    taskfile = parse_task_file_text(UPSTREAMS, "t.yaml", known_agents=AGENTS)
    limit = taskfile.upstreams["openai"]
    assert (limit.limit, limit.window, limit.burst) == (60, 60.0, 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            UPSTREAMS.replace("[openai]", "[openai, gpt]"),
            "t.yaml: task 'a': upstreams: undeclared upstream 'gpt' (declared: openai)",
        ),
        (
            UPSTREAMS.replace("limit: 60", "limit: 0"),
            "t.yaml: upstreams.openai.limit: Input should be greater than or equal to 1",
        ),
        (
            UPSTREAMS.replace("window: 1m", "window: 0s"),
            "t.yaml: upstreams.openai.window: Input should be greater than 0",
        ),
        (UPSTREAMS.replace("burst: 5", "rate: 5"), "t.yaml: upstreams.openai.rate: unknown field"),
    ],
)
def test_upstream_problems(text: str, expected: str) -> None:
    assert problems_of(text) == [expected]


def test_x_keys_hold_anchors_for_reuse() -> None:
    text = """
x-defaults: &defaults {agent: echo, timeout: 5s, schedule: {every: 1m}}
tasks:
  - {<<: *defaults, id: a}
  - {<<: *defaults, id: b, timeout: 9s}
"""
    a, b = parse_task_file_text(text, "t.yaml", known_agents=AGENTS).tasks
    assert (a.timeout, b.timeout, a.agent) == (5.0, 9.0, "echo")


def test_of_several_merged_mappings_the_earlier_wins() -> None:
    """YAML's merge: "keys in mapping nodes earlier in the sequence override keys specified
    in later mapping nodes". PyYAML 6.0.4 let the later one win."""
    text = """
x-base: &base {agent: echo, timeout: 1m, window: 10m}
x-fast: &fast {timeout: 5s}
x-slow: &slow {timeout: 1h, agent: sleep}
tasks:
  - {<<: [*fast, *base], id: a}
  - {<<: [*fast, *slow, *base], id: b}
  - {<<: [*slow, *fast], id: c, timeout: 9s}
"""
    a, b, c = parse_task_file_text(text, "t.yaml", known_agents=AGENTS).tasks
    assert (a.agent, a.timeout, a.window) == ("echo", 5.0, 600.0)
    assert (b.agent, b.timeout, b.window) == ("sleep", 5.0, 600.0)
    assert (c.agent, c.timeout) == ("sleep", 9.0)


@pytest.mark.parametrize("name", ["missing.yaml", "."])
def test_unreadable_paths(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(ConfigError) as caught:
        load_task_file(path)
    [line] = caught.value.problems
    assert line.startswith(f"{path}: ")
    assert "file not found" in line or "cannot read file" in line


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("tasks: [{id: caf\xe9, agent: echo}]".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_task_file(path)


@pytest.mark.parametrize(
    ("schedule", "kind"),
    [
        ("{every: 1h, dst: {gap: skip}}", "every schedule"),
        ("{every: 1h, timezone: Europe/Berlin, dst: {fold: both}}", "every schedule"),
        ("{every: 1h, dst: {}}", "every schedule"),
        ("{timezone: Europe/Berlin, dst: {gap: skip}}", "on-demand task"),
    ],
)
def test_dst_is_refused_where_no_cron_reads_it(schedule: str, kind: str) -> None:
    """`dst` rules how a cron's local wall times map to instants: an `every` schedule counts
    UTC intervals and an on-demand task has no fire times, so it would be silently ignored."""
    text = f"tasks:\n  - {{id: a, agent: echo, schedule: {schedule}}}\n"
    [problem] = problems_of(text)
    assert problem.startswith(f"t.yaml: task 'a': schedule.dst: applies to cron only (an {kind}")
    assert problem.endswith("): remove it")


def test_dst_with_cron_loads_and_a_stored_every_spec_still_does() -> None:
    """The stored form of every spec carries `dst` (its defaults): reading it back is not
    refused, only a file that writes it where it means nothing."""
    text = "tasks:\n  - {id: a, agent: echo, schedule: {every: 1h}}\n"
    [spec] = parse_task_file_text(text, "t.yaml", known_agents=AGENTS).tasks
    assert from_record(to_records(TaskFile(tasks=[spec]))[0]) == spec
    cron = "{cron: '0 9 * * *', timezone: Europe/Berlin, dst: {gap: skip}}"
    text = f"tasks:\n  - {{id: b, agent: echo, schedule: {cron}}}\n"
    [spec] = parse_task_file_text(text, "t.yaml", known_agents=AGENTS).tasks
    assert spec.schedule is not None and spec.schedule.dst.gap == "skip"
