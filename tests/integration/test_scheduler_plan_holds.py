"""`taskstream plan` against what the scheduler then does, on real Redis and a real store with
the clock passed in: a start held by a maintenance window and then by `not_before`."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.preview import preview
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from taskstream.scheduler.trail import decision_trail
from tests.integration.harness import Harness

MIN = 60_000
HOUR = 60 * MIN
D0 = 1_780_000_000_000 - 1_780_000_000_000 % (24 * HOUR)
"""A UTC midnight (2026-05-28)."""


def task(not_before: str) -> str:
    return (
        "tasks:\n"
        "  - {id: t, agent: echo, schedule: {cron: '30 1 * * *', timezone: UTC}, window: 5m,\n"
        f"     not_before: '{not_before}',\n"
        "     calendar: {maintenance: [{start: '01:00', end: '02:00'}]}}\n"
    )


@pytest.mark.parametrize(("not_before", "runs"), [("02:15", True), ("03:00", False)])
async def test_plan_says_whether_a_start_held_by_maintenance_then_not_before_runs(
    store: SqlStore, redis: streams.Redis, keys: Keys, not_before: str, runs: bool
) -> None:
    """01:30 waits for the maintenance window's end, 02:00, then for `not_before`: until
    02:15 it is within the catch-up reach (01:30 + 1 h) and runs; until 03:00 it is past
    it and is `skip_window`. The plan line says so: held until then, past the window or not."""
    h = Harness(store, redis, keys, FixedClock(D0 + 50 * MIN))
    await h.apply(task(not_before))
    [spec] = await h.definitions()
    fire_ms = D0 + 90 * MIN
    [line] = preview(spec, from_ms=fire_ms, to_ms=fire_ms, limit=10)
    s = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    while h.clock.now_ms() < D0 + 3 * HOUR + 10 * MIN:
        await s.run_pass()
        h.clock.set(h.clock.now_ms() + MIN)
    final = (await decision_trail(store, "t", fire_ms))[-1]
    assert (final.decision == "should_run") is runs, final
    assert line.held_past_window is not runs
    assert line.deferral is not None
    hour, minute = (int(part) for part in not_before.split(":"))
    if runs:
        assert line.deferral.until_ms == D0 + hour * HOUR + minute * MIN
        made = final.details["now_ms"]
        assert line.deferral.until_ms <= made < line.deferral.until_ms + MIN


async def test_plan_says_a_start_held_by_not_before_into_maintenance_is_skipped(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """00:50 is held by `not_before` until 01:15, inside its 1 h window; but 01:15 is inside
    the maintenance window, which ends at 02:00, past the catch-up reach (00:50 + 1 h): the
    scheduler skips the tick (`skip_calendar`), and the plan line says so."""
    text = (
        "tasks:\n"
        "  - {id: t, agent: echo, schedule: {cron: '50 0 * * *', timezone: UTC}, window: 1h,\n"
        "     not_before: '01:15', calendar: {maintenance: [{start: '01:00', end: '02:00'}]}}\n"
    )
    h = Harness(store, redis, keys, FixedClock(D0 + 40 * MIN))
    await h.apply(text)
    [spec] = await h.definitions()
    fire_ms = D0 + 50 * MIN
    [line] = preview(spec, from_ms=fire_ms, to_ms=fire_ms, limit=10)
    s = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    while h.clock.now_ms() < D0 + 2 * HOUR + 10 * MIN:
        await s.run_pass()
        h.clock.set(h.clock.now_ms() + MIN)
    final = (await decision_trail(store, "t", fire_ms))[-1]
    assert final.decision == "skip_calendar", final
    assert line.deferral is not None and line.held_past_window
    assert line.deferral.details["maintenance"] == "01:00-02:00"
