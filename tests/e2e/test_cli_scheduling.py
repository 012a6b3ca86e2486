"""The scheduling commands driven as subprocesses against a throwaway SQLite store and the
test Redis (its own namespace, whose keys are deleted afterwards)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.calendar import calendar_block
from tests.e2e.cli_rig import migrated_store, run_cli

TASKS = """
tasks:
  - id: nightly
    agent: echo
    schedule: {cron: "30 2 * * *", timezone: Europe/Berlin}
  - id: report
    agent: echo
    schedule: {cron: "0 9 * * *", timezone: Europe/Berlin}
    calendar: {exclude_dates: [2024-12-25, 2026-12-25]}
"""
MAINTENANCE = """
tasks:
  - id: backup
    agent: echo
    schedule: {cron: "30 1 * * *", timezone: Europe/Berlin}
    calendar: {maintenance: [{start: "01:00", end: "02:00", days: [sun]}]}
  - id: backup-strict
    agent: echo
    schedule: {cron: "30 1 * * *", timezone: Europe/Berlin}
    calendar: {maintenance: [{start: "01:00", end: "02:00", days: [sun]}]}
    catchup: {enabled: false}
"""
CHRISTMAS_9H_MS = 1_798_185_600_000  # 2026-12-25T09:00:00+01:00


@dataclass(frozen=True)
class Cli:
    """Runs `taskstream` in `cwd` with the cluster given by `env`."""

    cwd: Path
    env: dict[str, str]
    database_url: str

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        out = run_cli(*args, env=self.env, cwd=self.cwd)
        assert out.returncode == code, (args, out.returncode, out.stdout, out.stderr)
        return out

    def json(self, *args: str) -> object:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def cli(tmp_path: Path, redis_url: str) -> Iterator[Cli]:
    namespace = "e2e" + uuid.uuid4().hex[:12]
    database_url = migrated_store(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env |= {
        "TASKSTREAM_DATABASE_URL": database_url,
        "TASKSTREAM_REDIS_URL": redis_url,
        "TASKSTREAM_NAMESPACE": namespace,
        "COLUMNS": "200",
    }
    (tmp_path / "tasks.yaml").write_text(TASKS)
    run = Cli(tmp_path, env, database_url)
    run("tasks", "apply", "tasks.yaml")
    yield run
    client = redis.Redis.from_url(redis_url)
    found = list(client.scan_iter(match=f"ts:{{{namespace}}}:*", count=500))
    if found:
        client.delete(*found)
    client.close()


def record(database_url: str, row: DecisionRow) -> None:
    async def go() -> None:
        store = await SqlStore.connect(database_url)
        try:
            await store.record_decision(row)
        finally:
            await store.close()

    asyncio.run(go())


def test_plan_marks_the_berlin_dst_gap_and_runs_nothing(cli: Cli) -> None:
    args = ("plan", "nightly", "--from", "2026-03-28", "--to", "2026-03-30T12:00:00+02:00")
    out = cli(*args).stdout
    assert "gap_shifted from 02:30:00" in out
    assert "2026-03-29T03:00:00+02:00" in out
    assert "3 fire time(s)" in out
    plan = cli.json(*args)
    assert isinstance(plan, dict)
    fires = plan["fires"]
    assert [f["dst"] for f in fires] == [None, "gap_shifted", None]
    assert fires[1]["utc"] == "2026-03-29T01:00:00.000Z"
    assert fires[1]["shifted_from"] == ["2026-03-29T02:30:00"]
    assert cli("instances", "--json").stdout.strip() == "[]"


def test_plan_shows_calendar_exclusions(cli: Cli) -> None:
    out = cli("plan", "report", "--from", "2026-12-24", "--to", "2026-12-26").stdout
    assert "excluded: exclude_date (2026-12-25)" in out


def test_plan_shows_a_start_held_until_maintenance_ends_or_skipped(cli: Cli) -> None:
    """2026-12-06 is a Sunday: its 01:30 run waits for 02:00 with catch-up, else is skipped."""
    (cli.cwd / "maintenance.yaml").write_text(MAINTENANCE)
    cli("tasks", "apply", "maintenance.yaml")
    span = ("--from", "2026-12-05", "--to", "2026-12-07")
    out = cli("plan", "backup", *span).stdout
    assert "deferred to 02:00, end of maintenance 01:00-02:00 on sun" in out
    assert "3 fire time(s)" in out  # to the end of 2026-12-07, a Monday
    plan = cli.json("plan", "backup", *span)
    assert isinstance(plan, dict)
    held = [f["deferred"] for f in plan["fires"]]
    assert [h is not None for h in held] == [False, True, False]
    assert held[1]["until_ms"] == 1_796_518_800_000  # 2026-12-06T02:00:00+01:00
    assert held[1]["past_window"] is False
    strict = cli("plan", "backup-strict", *span).stdout
    assert "excluded: maintenance (01:00-02:00 on sun)" in strict


def test_explain_names_the_rule_that_skipped_a_tick_and_what_it_saw(cli: Cli) -> None:
    text = parse_task_file_text(TASKS, "t.yaml")
    spec = next(t for t in text.tasks if t.id == "report")
    block = calendar_block(spec, CHRISTMAS_9H_MS)
    assert block is not None
    details: dict[str, Any] = {"fire_time_ms": CHRISTMAS_9H_MS, "now_ms": CHRISTMAS_9H_MS + 20}
    details["calendar"] = {**block.details, "rule": block.rule, "checked": "fire"}
    reason = f"calendar: {block.reason}"
    row = DecisionRow("report", CHRISTMAS_9H_MS, "skip_calendar", reason, details, None, 1)
    record(cli.database_url, row)

    out = cli("explain", "report", "--at", "2026-12-25T10:00:00+01:00").stdout
    assert "fire time 2026-12-25T08:00:00.000Z" in out
    assert "skip_calendar: calendar: 2026-12-25 is an excluded date" in out
    assert "rule: calendar (exclude_date)" in out
    assert "calendar.excluded_date=2026-12-25" in out
    assert "calendar.weekday=fri" in out
    assert "did not run: skip_calendar" in out
    data = cli.json("explain", "report")
    assert isinstance(data, dict)
    assert data["fire_time_ms"] == CHRISTMAS_9H_MS
    assert data["decisions"][0]["rule"] == "calendar (exclude_date)"
    assert data["decisions"][0]["saw"]["calendar"]["excluded_date"] == "2026-12-25"


def test_pause_and_resume_show_in_tasks_list(cli: Cli) -> None:
    def paused() -> dict[str, bool]:
        rows = cli.json("tasks", "list")
        assert isinstance(rows, list)
        return {r["task_id"]: r["paused"] for r in rows}

    assert cli("pause", "nightly").stdout == "nightly: paused\n"
    assert cli("pause", "nightly").stdout == "nightly: already paused\n"
    assert paused() == {"nightly": True, "report": False}
    assert cli("explain", "nightly").stdout == (
        "nightly: no decision recorded: the task is paused, and the scheduler decides none of"
        " its fire times until `taskstream resume nightly`\n"
    )
    assert cli("resume", "nightly").stdout == "nightly: resumed\n"
    assert cli("resume", "nightly").stdout == "nightly: not paused, nothing to resume\n"
    assert paused() == {"nightly": False, "report": False}
    assert "no decision recorded yet" in cli("explain", "nightly").stdout
    assert "unknown task 'nope'" in cli("pause", "nope", code=1).stderr


def test_mark_sets_a_readiness_marker_once(cli: Cli) -> None:
    first = cli("mark", "raw.ready", "--date", "2026-12-01")
    assert first.stdout == "raw.ready 2026-12-01: marked\n"
    assert first.stderr == (
        "warning: no stored task depends on 'raw.ready' (markers tasks wait for: none)\n"
    )
    again = cli("mark", "raw.ready", "--date", "2026-12-01").stdout
    assert again == "raw.ready 2026-12-01: already marked\n"
    assert "--date" in cli("mark", "raw.ready", "--date", "2026-02-30", code=2).stderr


def test_trigger_twice_for_one_fire_time_reports_a_duplicate(cli: Cli) -> None:
    args = ("trigger", "report", "--at", "2026-11-30T09:00:00+01:00", "--payload", '{"n": 1}')
    first = cli(*args).stdout
    assert first.startswith("report: published i_")
    second = cli(*args).stdout
    assert second.startswith("report: duplicate i_")
    assert first.split()[2] == second.split()[2]
    rows = cli.json("instances", "--task", "report")
    assert isinstance(rows, list)
    assert len(rows) == 1
    assert rows[0]["payload"] == {"n": 1}
    data = cli.json("explain", "report")
    assert isinstance(data, dict)
    assert [d["decision"] for d in data["decisions"]] == ["should_run", "skip_duplicated"]


def test_backfill_reports_published_duplicate_and_calendar_skipped(cli: Cli) -> None:
    args = ("backfill", "report", "--from", "2024-12-23", "--to", "2024-12-26T23:00:00Z")
    assert cli(*args).stdout.endswith(
        "4 fire time(s) from 2024-12-23T00:00:00.000Z to 2024-12-26T23:00:00.000Z: "
        "3 published, 0 duplicate, 1 skipped by the calendar\n"
    )
    assert ": 0 published, 3 duplicate, 1 skipped" in cli(*args).stdout
    over = cli(*args, "--limit", "3", code=2).stderr
    assert "covers 4 fire times, over the limit of 3" in over
    future = cli("backfill", "report", "--from", "2999-01-01", "--to", "2999-01-02", code=2)
    assert "error: backfill covers past fire times only" in future.stderr


def test_backfill_to_a_bare_date_covers_that_day_up_to_now(cli: Cli) -> None:
    """`--to 2024-12-26` holds the whole day; `--to` today ends now, not in the future."""
    whole_day = cli("backfill", "report", "--from", "2024-12-23", "--to", "2024-12-26").stdout
    assert "4 fire time(s) from 2024-12-23T00:00:00.000Z to 2024-12-26T23:59:59.999Z" in whole_day
    today = datetime.now(UTC).date()
    span = ("--from", (today - timedelta(days=2)).isoformat(), "--to", today.isoformat())
    out = cli("backfill", "nightly", *span).stdout
    assert out.startswith("nightly: ") and " published, " in out


def test_bad_input_exits_2_naming_the_argument_and_unknown_tasks_exit_1(cli: Cli) -> None:
    naive = cli("trigger", "report", "--at", "2026-12-01T09:00:00", code=2).stderr
    assert "--at" in naive
    assert "no UTC offset" in naive
    assert (
        "--from"
        in cli("plan", "report", "--from", "2026-12-01T09:00", "--to", "now", code=2).stderr
    )
    assert "--payload" in cli("trigger", "report", "--payload", "{oops", code=2).stderr
    assert "unknown task 'ghost'" in cli("trigger", "ghost", code=1).stderr
    assert "unknown task 'ghost'" in cli("explain", "ghost", code=1).stderr
    assert cli("instances", "--json").stdout.strip() == "[]"


def test_tables_show_whole_instance_ids_for_inspect_even_on_a_narrow_terminal(cli: Cli) -> None:
    published = cli("trigger", "report", "--at", "2026-11-30T09:00:00+01:00").stdout
    instance_id = published.split()[2]
    narrow = Cli(cli.cwd, cli.env | {"COLUMNS": "60"}, cli.database_url)
    listed = narrow("instances").stdout
    assert instance_id in listed, listed
    shown = narrow("inspect", instance_id).stdout
    assert f"id: {instance_id}\n" in shown
    assert "scheduled_for_ms: 1796025600000 (2026-11-30T08:00:00.000Z)" in shown
    assert "2026-11-30T08:00:00.000Z" in cli("instances").stdout
