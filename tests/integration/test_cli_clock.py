"""Operator commands on a host whose clock is off: they take "now" from the database clock
that every role keeps to, so a run they make gets the fire time, deadline and business date
the cluster would give it, `retry` judges deadlines on the cluster's time, and a range ending
(or starting) `now` is judged on the cluster's time too. Input bad at any time is still refused
before any connection is made."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from taskstream.cli.main import app
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from tests.integration.harness import Harness
from tests.support.stepped_time import SteppedTime, stepped_host

TASK = """
tasks:
  - id: report
    agent: echo
    deadline: 5m
"""
MINUTELY = """
tasks:
  - id: minutely
    agent: echo
    schedule: {every: 1m}
"""
SKEW_MS = 10 * 60_000
NO_DATABASE = "mysql://root@127.0.0.1:1/none"  # nothing listens on port 1


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> SteppedTime:
    return stepped_host(monkeypatch)


async def _cli(db_url: str, redis_url: str, keys: Keys, *args: str) -> Any:
    env = {
        "TASKSTREAM_DATABASE_URL": db_url,
        "TASKSTREAM_REDIS_URL": redis_url,
        "TASKSTREAM_NAMESPACE": keys.namespace,
        "TASKSTREAM_KEY_PREFIX": keys.prefix,
    }
    # The command runs its own event loop: in a thread, beside the test's.
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def test_a_trigger_from_a_slow_host_gets_the_clusters_times(
    store: SqlStore, redis: streams.Redis, keys: Keys, db_url: str, redis_url: str, host: Any
) -> None:
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    await h.apply(TASK)
    host.step_ms = -SKEW_MS
    done = await _cli(db_url, redis_url, keys, "trigger", "report")
    assert done.exit_code == 0, done.output
    [row] = await store.list_instances(task_id="report")
    db_now = await store.db_now_ms()
    assert row.scheduled_for_ms is not None and row.deadline_ms is not None
    assert db_now - 10_000 <= row.scheduled_for_ms <= db_now
    assert row.deadline_ms > db_now, "the run was made past its deadline"


async def test_a_retry_from_a_fast_host_judges_the_deadline_on_the_clusters_time(
    store: SqlStore, redis: streams.Redis, keys: Keys, db_url: str, redis_url: str, host: Any
) -> None:
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    await h.apply(TASK)
    row = await h.trigger(TASK, "report", fire_ms=h.clock.now_ms())
    failed = await store.transition(
        row.id, Status.DISPATCHED, Status.FAILED, reason="setup", fail_class=FailClass.FATAL
    )
    assert failed.ok
    host.step_ms = SKEW_MS
    done = await _cli(db_url, redis_url, keys, "retry", row.id, "--reason", "fixed")
    assert done.exit_code == 0, done.output
    again = await store.get_instance(row.id)
    assert again is not None and again.status in (Status.PENDING, Status.DISPATCHED)


def _iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()


@pytest.fixture
async def minutely(store: SqlStore, redis: streams.Redis, keys: Keys) -> None:
    """The `minutely` task applied."""
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    await h.apply(MINUTELY)


RangeCase = tuple[str, int, int | None, int | None]
"""The command, the host's step (ms), and `--from` and `--to` as ms from the cluster's now
(None: `now`)."""


@pytest.mark.parametrize(
    "case",
    [
        ("backfill", -SKEW_MS, -3 * 60_000, None),
        ("plan", -SKEW_MS, -3 * 60_000, None),
        ("plan", SKEW_MS, None, 3 * 60_000),
    ],
    ids=["backfill-slow-host", "plan-slow-host", "plan-fast-host"],
)
@pytest.mark.usefixtures("minutely")
async def test_a_range_against_now_is_judged_on_the_clusters_time(
    store: SqlStore, keys: Keys, db_url: str, redis_url: str, host: Any, case: RangeCase
) -> None:
    """`--from` minutes before the cluster's now `--to now` (or `--from now` to minutes after
    it) is a valid range, though on a host 10 min slow (fast) its ends are in the wrong order."""
    command, step_ms, since_ms, until_ms = case
    db_now = await store.db_now_ms()
    since = "now" if since_ms is None else _iso(db_now + since_ms)
    until = "now" if until_ms is None else _iso(db_now + until_ms)
    host.step_ms = step_ms
    done = await _cli(db_url, redis_url, keys, command, "minutely", "--from", since, "--to", until)
    assert done.exit_code == 0, done.output
    if command == "backfill":
        rows, after = await store.list_instances(task_id="minutely"), await store.db_now_ms()
        assert rows, "the backfill made no run"
        assert all(db_now - 3 * 60_000 <= (r.scheduled_for_ms or 0) <= after for r in rows)


@pytest.mark.usefixtures("minutely")
async def test_a_range_wrong_on_the_clusters_time_is_still_refused(
    store: SqlStore, keys: Keys, db_url: str, redis_url: str, host: Any
) -> None:
    since = _iso(await store.db_now_ms() + 3 * 60_000)
    host.step_ms = -SKEW_MS
    done = await _cli(
        db_url, redis_url, keys, "backfill", "minutely", "--from", since, "--to", "now"
    )
    assert done.exit_code == 2
    assert "Invalid value for --from: --from is after --to" in done.output
    assert await store.list_instances(task_id="minutely") == []


@pytest.mark.parametrize(
    ("since", "until", "named"),
    [
        ("2026-12-02", "2026-12-01", "--from is after --to"),
        ("tomorrow", "now", "'tomorrow' is not ISO 8601"),
    ],
)
async def test_input_bad_at_any_time_is_refused_before_connecting(
    keys: Keys, redis_url: str, since: str, until: str, named: str
) -> None:
    done = await _cli(NO_DATABASE, redis_url, keys, "plan", "x", "--from", since, "--to", until)
    assert done.exit_code == 2, done.output
    assert f"Invalid value for --from: {named}" in done.output
