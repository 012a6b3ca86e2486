"""Operator commands on a host whose clock is off: they take "now" from the database clock
that every role keeps to, so a run they make gets the fire time, deadline and business date
the cluster would give it, and `retry` judges deadlines on the cluster's time."""

from __future__ import annotations

import asyncio
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
SKEW_MS = 10 * 60_000


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
