"""`tasks validate`, `tasks apply` and `trigger --payload` refuse bad input with lines naming
the file and where (exit 2), never a traceback, and before anything reaches the store."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cli_rig import Cli, applied, migrated_store, run_cli

NO_STORE = "mysql://root@127.0.0.1:1/taskstream"  # nothing listens on port 1
ON_DEMAND = "tasks:\n  - id: od\n    agent: echo\n    payload: {n: 1}\n"
BIG_PAYLOAD = '{"blob": "' + "x" * 2000 + '"}'
SMALL_LIMIT = "1024"


def _env(database_url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_DATABASE_URL"] = database_url
    return env | {f"TASKSTREAM_{k.upper()}": v for k, v in settings.items()}


def _laughs() -> str:
    lines = ['x-a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        name, before = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"x-{name}: &{name} [" + ", ".join([f"*{before}"] * 9) + "]")
    return "\n".join(lines) + "\ntasks:\n  - {id: bomb, agent: echo, payload: {p: *i}}\n"


BAD_FILES = {
    "bomb.yaml": (_laughs(), "line 6: expanding aliases would add more than 100000 nodes"),
    "surrogate.yaml": (
        'tasks:\n  - id: s\n    agent: echo\n    payload: {msg: "a\\ud800b"}\n',
        "line 4: tasks[0].payload.msg: the value holds the lone surrogate '\\ud800'",
    ),
    "deep.yaml": ("tasks: " + "[" * 100_000 + "]" * 100_000 + "\n", "line 1: nested more than"),
    "date.yaml": (
        "tasks:\n  - id: d\n    agent: echo\n    schedule: {cron: '0 9 * * *', timezone: UTC}\n"
        "    calendar: {exclude_dates: [2026-02-30]}\n",
        "line 5: invalid date or time '2026-02-30': day is out of range for month",
    ),
    "big.yaml": (
        "tasks:\n  - id: big\n    agent: echo\n    payload: {blob: " + "x" * 300_000 + "}\n",
        "task 'big': payload: 300011 bytes as stored JSON, over the limit of 262144 bytes "
        "(TASKSTREAM_MAX_PAYLOAD_BYTES)",
    ),
}


@pytest.mark.parametrize("command", ["validate", "apply"])
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it_before_the_store(
    tmp_path: Path, name: str, command: str
) -> None:
    text, expected = BAD_FILES[name]
    (tmp_path / name).write_text(text)
    out = run_cli("tasks", command, name, env=_env(NO_STORE), cwd=tmp_path)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr[-2000:]
    assert out.stderr.startswith(f"{name}: {expected}")
    assert len(out.stderr.splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_a_refused_apply_keeps_the_stored_definition(tmp_path: Path) -> None:
    env = _env(migrated_store(tmp_path))
    (tmp_path / "tasks.yaml").write_text(ON_DEMAND)
    run_cli("tasks", "apply", "tasks.yaml", env=env, cwd=tmp_path, check=True)
    before = run_cli("tasks", "list", "--json", env=env, cwd=tmp_path, check=True).stdout
    (tmp_path / "tasks.yaml").write_text(ON_DEMAND.replace("{n: 1}", BIG_PAYLOAD))
    out = run_cli(
        "tasks",
        "apply",
        "tasks.yaml",
        env=env | {"TASKSTREAM_MAX_PAYLOAD_BYTES": "1024"},
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("tasks.yaml: task 'od': payload: 2011 bytes as stored JSON")
    after = run_cli("tasks", "list", "--json", env=env, cwd=tmp_path, check=True).stdout
    assert json.loads(after) == json.loads(before)


GATED = "tasks:\n  - {id: g, agent: echo, preconditions: [warehouse.open, feed.fresh]}\n"
CHECKS = """
async def warehouse_open(task_id: str, business_date: str) -> str:
    return "pass"


PRECONDITIONS = {"warehouse.open": warehouse_open}
"""


def test_a_precondition_no_module_provides_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tasks.yaml").write_text(GATED)
    (tmp_path / "team_checks.py").write_text(CHECKS)
    env = _env(NO_STORE, precondition_modules="team_checks") | {"PYTHONPATH": str(tmp_path)}
    out = run_cli("tasks", "validate", "tasks.yaml", env=env, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr[-2000:]
    assert out.stderr.splitlines() == [
        "tasks.yaml: task 'g': preconditions: unknown precondition 'feed.fresh'"
        " (known: warehouse.open)"
    ]
    (tmp_path / "tasks.yaml").write_text(GATED.replace(", feed.fresh", ""))
    out = run_cli("tasks", "validate", "tasks.yaml", env=env, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (0, "tasks.yaml: ok, 1 task(s)\n"), out.stderr


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Cli]:
    """One store with the on-demand task `od`, shared: every trigger here is refused."""
    with applied(tmp_path_factory.mktemp("trigger"), redis_url, {"tasks.yaml": ON_DEMAND}) as run:
        run.env["TASKSTREAM_MAX_PAYLOAD_BYTES"] = SMALL_LIMIT
        yield run


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            BIG_PAYLOAD,
            "2011 bytes as stored JSON, over the limit of 1024 bytes "
            "(TASKSTREAM_MAX_PAYLOAD_BYTES)",
        ),
        ('{"a": 1, "a": 2}', 'duplicate key "a": a JSON object may name each key once'),
        ('{"a": {"b": 1, "b": 2}}', 'duplicate key "b": a JSON object may name each key once'),
        ('{"a": "\\ud800"}', "holds the lone surrogate '\\ud800', which is not Unicode text"),
        ('{"a": 1e999}', "1e999 is too large for a JSON number"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "not valid JSON: nested too deeply"),
    ],
)
def test_trigger_refuses_a_bad_payload_and_creates_nothing(
    cli: Cli, payload: str, expected: str
) -> None:
    out = run_cli("trigger", "od", "--payload", payload, env=cli.env, cwd=cli.cwd)
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    assert "Invalid value for --payload" in out.stderr
    assert " ".join(expected.split()) in " ".join(out.stderr.replace("│", " ").split())
    assert "Traceback" not in out.stderr
    assert cli("instances", "--json").strip() == "[]"


def test_trigger_takes_a_payload_within_the_limit(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {"tasks.yaml": ON_DEMAND}) as run:
        run.env["TASKSTREAM_MAX_PAYLOAD_BYTES"] = SMALL_LIMIT
        out = run("trigger", "od", "--payload", '{"blob": "' + "x" * 900 + '"}')
    assert out.startswith("od: published i_")
