"""Maintenance windows on real Redis and a real store, clock passed in: a start inside one
waits for its end or is skipped, per the task's catch-up policy (DESIGN.md §2)."""

from __future__ import annotations

import pytest

from taskstream.cli.explain_cmd import explain_data
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from taskstream.scheduler.trail import decision_trail
from tests.integration.harness import Harness

MIN = 60_000
HOUR = 60 * MIN
D0 = 1_780_000_000_000 - 1_780_000_000_000 % (24 * HOUR)
"""A UTC midnight (2026-05-28); the tasks below keep 01:00-02:00 UTC for maintenance."""


def task(schedule: str, **fields: str) -> str:
    extra = "".join(f", {key}: {value}" for key, value in fields.items())
    return (
        "tasks:\n"
        f"  - {{id: t, agent: echo, schedule: {schedule}, window: 5m{extra},\n"
        '     calendar: {maintenance: [{start: "01:00", end: "02:00"}]}}\n'
    )


EVERY_10M = "{every: 10m, timezone: UTC}"
DAILY_0130 = '{cron: "30 1 * * *", timezone: UTC}'


@pytest.fixture
def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return Harness(store, redis, keys, FixedClock(D0 + 50 * MIN - 1))


def scheduler(h: Harness) -> Scheduler:
    return Scheduler(h.store, h.outbox, h.clock, SchedulerConfig())


async def passes(h: Harness, s: Scheduler, until_ms: int, step_ms: int = MIN) -> None:
    """A pass every `step_ms` up to and including `until_ms`."""
    while h.clock.now_ms() < until_ms:
        h.clock.set(min(until_ms, h.clock.now_ms() + step_ms))
        await s.run_pass()


async def runs(h: Harness) -> list[tuple[int, int]]:
    """(fire time, when the scheduler made its run) of every instance, in minutes after D0,
    the second read from the scheduler's clock in the tick's `should_run` record."""
    found = []
    for row in await h.store.list_instances(task_id="t"):
        [made] = [d for d in await trail(h, row.scheduled_for_ms) if d.instance_id == row.id]
        found.append(((row.scheduled_for_ms - D0) // MIN, (made.details["now_ms"] - D0) // MIN))
    return sorted(found)


async def trail(h: Harness, at: int) -> list[DecisionRow]:
    """The decisions of one fire time: `at` minutes after D0, or an epoch ms."""
    fire_ms = at if at > D0 else D0 + at * MIN
    return await decision_trail(h.store, "t", fire_ms)


async def started(h: Harness, text: str) -> Scheduler:
    await h.apply(text)
    s = scheduler(h)
    await s.run_pass()
    return s


@pytest.mark.parametrize("marked", [False, True])
async def test_a_run_held_past_its_window_still_needs_its_marker(h: Harness, marked: bool) -> None:
    """The 01:30 run waits for the window's end, 02:00, after its own 5-minute window closed:
    a late tick, yet not a missed one. Its `depends_on` was never checked (the calendar comes
    first), so it is checked at 02:00 although `only_if_ready` is off, and a marker that is not
    there skips it instead of running the report on missing data."""
    s = await started(h, task(DAILY_0130, depends_on="[raw.ready]"))
    if marked:
        await h.store.mark_ready("raw.ready", "2026-05-28")
    await passes(h, s, D0 + 2 * HOUR + 2 * MIN)
    decided = (await trail(h, 90))[-1]
    assert decided.details["catchup"] is True
    assert decided.details["markers_missing"] == ([] if marked else ["raw.ready"])
    if marked:
        assert decided.decision == "should_run"
        assert await runs(h) == [(90, 120)]
    else:
        assert decided.decision == "skip_dep"
        assert decided.reason.startswith("raw.ready not ready once the maintenance window ended")
        assert await h.store.list_instances(task_id="t") == []


async def test_a_daily_run_inside_maintenance_starts_when_it_ends(h: Harness) -> None:
    s = await started(h, task(DAILY_0130))
    await passes(h, s, D0 + 90 * MIN)
    [held] = await trail(h, 90)
    assert (held.decision, held.instance_id) == ("deferred", None)
    assert (
        held.reason == "calendar: inside maintenance window 01:00-02:00, start held until its end"
    )
    assert held.details["calendar"]["until_ms"] == D0 + 2 * HOUR
    # The scheduler sleeps until the window ends, then the run starts: late, but once.
    assert await s.run_pass() == D0 + 2 * HOUR
    await passes(h, s, D0 + 2 * HOUR + 2 * MIN)
    assert await runs(h) == [(90, 120)]
    decided = (await trail(h, 90))[-1]
    assert decided.decision == "should_run"
    assert decided.details["catchup"] is True  # its 5 min window closed while it waited
    assert decided.reason.endswith("(after waiting for maintenance window 01:00-02:00)")
    waited = {"maintenance": "01:00-02:00", "until_ms": D0 + 2 * HOUR}
    assert decided.details["waited_for_maintenance"] == waited
    spec = (await h.definitions())[0]
    explained = explain_data(spec, None, D0 + 90 * MIN, await trail(h, 90), now_ms=h.clock.now_ms())
    assert explained["decisions"][0]["rule"] == "calendar (maintenance: start held until its end)"


async def test_latest_coalesces_the_held_ticks_into_the_first_after_the_window(h: Harness) -> None:
    s = await started(h, task(EVERY_10M))
    await passes(h, s, D0 + 2 * HOUR + 5 * MIN)
    # 00:50 ran before the window; 01:00 to 01:50 waited, then folded into the 02:00 tick.
    assert await runs(h) == [(50, 50), (120, 120)]
    for minute in range(60, 120, 10):
        rows = await trail(h, minute)
        decisions = [d.decision for d in rows]
        assert decisions[0] == "deferred" and decisions[-1] == "coalesced", (minute, decisions)
        assert rows[-1].reason.endswith("(after waiting for maintenance window 01:00-02:00)")
        # Folded into the next tick, which itself waited (or, for 01:50, ran at 02:00).
        assert rows[-1].details["coalesced_into_ms"] == D0 + (minute + 10) * MIN


async def test_all_runs_every_held_tick_when_the_window_ends(h: Harness) -> None:
    s = await started(h, task(EVERY_10M, catchup="{mode: all}"))
    await passes(h, s, D0 + 2 * HOUR + 5 * MIN)
    held = [(minute, 120) for minute in range(60, 120, 10)]
    assert await runs(h) == [(50, 50), *held, (120, 120)]


async def test_without_catchup_the_ticks_inside_maintenance_are_skipped(h: Harness) -> None:
    s = await started(h, task(EVERY_10M, catchup="{enabled: false}"))
    await passes(h, s, D0 + 2 * HOUR + 5 * MIN)
    assert await runs(h) == [(50, 50), (120, 120)]
    for minute in range(60, 120, 10):
        [skipped] = await trail(h, minute)
        assert skipped.decision == "skip_calendar"


async def test_a_wait_past_max_delay_is_skipped(h: Harness) -> None:
    s = await started(h, task(DAILY_0130, catchup="{max_delay: 20m}"))
    await passes(h, s, D0 + 2 * HOUR + 2 * MIN)
    assert await runs(h) == []
    [skipped] = await trail(h, 90)
    assert skipped.decision == "skip_calendar"
    assert "past the catch-up reach" in skipped.reason


async def test_a_new_scheduler_keeps_the_wait_of_the_one_before(h: Harness) -> None:
    s = await started(h, task(DAILY_0130))
    await passes(h, s, D0 + 95 * MIN)
    # Another scheduler takes over mid-wait: it rebuilds the wait from the explain log.
    other = scheduler(h)
    assert await other.run_pass() == D0 + 2 * HOUR
    await passes(h, other, D0 + 2 * HOUR + 2 * MIN)
    assert await runs(h) == [(90, 120)]
    assert [d.decision for d in await trail(h, 90)] == ["deferred", "should_run"]


@pytest.mark.parametrize("woke_late_ms", [0, MIN - 1])
async def test_held_ticks_whose_window_is_still_open_all_run_under_latest(
    h: Harness, woke_late_ms: int
) -> None:
    """With a 1 h window, every tick held from 01:00 to 01:50 is still on time when the
    maintenance ends at 02:00, so each runs then under `latest`; none is folded into a newer
    one. 01:00 may wait only until 02:00 (fire time + max(window, max_delay)): a scheduler
    that wakes a minute after that instead of at it finds 01:00 `missed`."""
    text = task(EVERY_10M).replace("window: 5m", "window: 1h")
    s = await started(h, text)
    await passes(h, s, D0 + 2 * HOUR - 1)
    h.clock.set(D0 + 2 * HOUR + woke_late_ms)
    await s.run_pass()
    await passes(h, s, D0 + 2 * HOUR + 5 * MIN)
    held = [(minute, 120) for minute in range(70, 120, 10)]
    made = [d for d in await trail(h, 60) if d.decision != "deferred"]
    if woke_late_ms:
        assert [(d.decision, "older than catchup.max_delay" in d.reason) for d in made] == [
            ("missed", True)
        ]
    else:
        assert [d.decision for d in made] == ["should_run"]
        held.insert(0, (60, 120))
    assert [r for r in await runs(h) if r[0] != 60 or not woke_late_ms] == [
        (50, 50),
        *held,
        (120, 120),
    ]


NOT_BEFORE_THEN_MAINTENANCE = (
    "tasks:\n  - {id: r, agent: echo, schedule: {cron: '0 6 * * *', timezone: UTC},"
    " window: 1h, not_before: '06:30', catchup: {max_delay: 2h},"
    " calendar: {maintenance: [{start: '06:30', end: '07:30'}]}}\n"
)


@pytest.mark.parametrize("restart", [False, True])
async def test_a_hold_that_turns_into_a_maintenance_wait_is_recorded(
    store: SqlStore, redis: streams.Redis, keys: Keys, restart: bool
) -> None:
    """06:00 is held until 06:30 by `not_before`; at 06:30 maintenance holds it until 07:30.
    That second hold is recorded, so a scheduler that starts at 07:10 (restart or new
    leader) recalls a maintenance wait, and at 07:30 the tick runs rather than closing as
    `skip_window` (its window ended at 07:00)."""

    def at(hour: int, minute: int, second: int = 0) -> int:
        return D0 + hour * HOUR + minute * MIN + second * 1000

    h = Harness(store, redis, keys, FixedClock(at(5, 0)))
    await h.apply(NOT_BEFORE_THEN_MAINTENANCE)
    s = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    for now_ms in (at(5, 0), at(6, 0, 1), at(6, 30, 1)):
        h.clock.set(now_ms)
        await s.run_pass()
    if restart:
        s = Scheduler(store, h.outbox, h.clock, SchedulerConfig())
    for now_ms in (at(7, 10), at(7, 30, 1)):
        h.clock.set(now_ms)
        await s.run_pass()
    rows = [r for r in await store.decisions("r", since_ms=at(6, 0), limit=20)]
    assert [r.decision for r in rows] == ["deferred", "deferred", "should_run"]
    assert "maintenance" in rows[1].reason
