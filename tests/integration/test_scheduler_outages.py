"""The scheduler when the store or Redis fails in the middle of deciding a tick, on real
Redis and a real store (failures are real: a store or a Redis nobody listens for, a statement
whose connection is killed), clock passed in: the tick runs once and its decision is recorded
once, as what happened."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from taskstream.core import streams
from taskstream.core.errors import StoreUnavailable
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.urls import normalize_url
from taskstream.scheduler import verdict
from taskstream.scheduler.emit import missed_instance
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import Harness
from tests.integration.outages import kill_waiter

M0 = 1_780_000_020_000
"""A whole minute (epoch ms), so `every: 1m` fires at M0 + k minutes."""
TASKS = "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 1h}\n"
NO_CATCHUP = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 30s,"
    " catchup: {enabled: false}}\n"
)
GATED = "  - {id: gated, agent: echo, schedule: {every: 1m}, window: 1h, preconditions: [gate]}\n"
LATE_AND_HELD = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {cron: '27 20 * * *', timezone: UTC},"
    " window: 5m, not_before: '20:50', catchup: {max_delay: 1h}}\n"
)
REPLACES = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 1h,"
    " concurrency: replace}\n"
)
WAITS_5M = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 5m,"
    " depends_on: [feed]}\n"
)
WAITS = (
    "tasks:\n  - {id: minutely, agent: echo, schedule: {every: 1m}, window: 1h,"
    " depends_on: [feed]}\n"
)
NOBODY = "mysql://root@127.0.0.1:1/nothing"
"""A database URL nothing listens on (port 1)."""


@pytest.fixture
def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return Harness(store, redis, keys)


def _scheduler(h: Harness, outbox: Outbox) -> Scheduler:
    return Scheduler(h.store, outbox, h.clock, SchedulerConfig())


async def _first_pass(h: Harness) -> tuple[Outbox, Scheduler]:
    """The task applied and one pass made just before M0 (its cursor is stored); returns
    the outbox the test breaks and the scheduler that made the pass."""
    h.clock.set(M0 - 1)
    await h.apply(TASKS)
    outbox = h.outbox
    scheduler = _scheduler(h, outbox)
    await scheduler.run_pass()
    return outbox, scheduler


async def _the_instance(h: Harness) -> InstanceRow:
    [row] = [r for r in await h.store.list_instances(limit=10) if r.task_id == "minutely"]
    assert row.scheduled_for_ms == M0
    return row


async def _decisions(h: Harness) -> list[tuple[str, str | None]]:
    rows = await h.store.decisions("minutely", limit=10)
    return [(d.decision, d.instance_id) for d in rows if d.fire_time_ms == M0]


async def _entries(h: Harness) -> int:
    return sum([await h.redis.xlen(s) for s in h.keys.streams()])


async def _pass_whose_record_fails(h: Harness, scheduler: Scheduler) -> None:
    """One pass whose INSERT of a decision waits for this test's lock on the decisions table
    and has its connection killed (MariaDB)."""
    async with h.store.engine.connect() as conn:
        await conn.execute(text("LOCK TABLES trigger_decisions WRITE"))
        try:
            passed, _ = await asyncio.gather(
                scheduler.run_pass(),
                kill_waiter(conn, "INSERT INTO trigger_decisions%", release=False),
                return_exceptions=True,
            )
        finally:
            await conn.execute(text("UNLOCK TABLES"))
    assert isinstance(passed, StoreUnavailable)


async def _pass_whose_creation_fails(outbox: Outbox, scheduler: Scheduler) -> None:
    """One pass whose outbox creates instances in a store nobody listens for; the outbox's
    own store is back afterwards."""
    store = outbox.store
    nobody = SqlStore(make_engine(normalize_url(NOBODY)), display_url=NOBODY)
    outbox.store = nobody
    try:
        with pytest.raises(StoreUnavailable):
            await scheduler.run_pass()
    finally:
        outbox.store = store
        await nobody.close()


async def _pass_whose_cursor_write_fails(h: Harness, scheduler: Scheduler) -> None:
    """One pass whose cursor UPDATE waits for this test's row lock on the task's definition
    and has its connection killed (MariaDB)."""
    async with h.store.engine.connect() as conn:
        await conn.execute(
            text("SELECT task_id FROM task_definitions WHERE task_id = 'minutely' FOR UPDATE")
        )
        passed, _ = await asyncio.gather(
            scheduler.run_pass(),
            kill_waiter(conn, "UPDATE task_definitions%"),
            return_exceptions=True,
        )
    assert isinstance(passed, StoreUnavailable)


async def test_a_tick_whose_instance_could_not_be_created_runs_at_the_next_pass(
    h: Harness,
) -> None:
    outbox, scheduler = await _first_pass(h)
    h.clock.set(M0 + 1000)
    await _pass_whose_creation_fails(outbox, scheduler)
    assert await h.store.list_instances(limit=10) == []

    await scheduler.run_pass()
    await scheduler.run_pass()

    row = await _the_instance(h)
    assert row.status is Status.DISPATCHED
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]
    assert await _entries(h) == 1


async def test_a_tick_whose_entry_could_not_be_added_is_recorded_as_run_and_republished(
    h: Harness,
) -> None:
    outbox, scheduler = await _first_pass(h)
    dead = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    outbox.redis = dead
    h.clock.set(M0 + 1000)
    try:
        await scheduler.run_pass()
    finally:
        await dead.aclose()
    outbox.redis = h.redis
    await scheduler.run_pass()

    row = await _the_instance(h)
    assert row.status is Status.PENDING
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]
    [record] = await h.store.decisions("minutely", limit=1)
    assert record.details["outcome"] == "unpublished"
    assert await _entries(h) == 0

    # The reconciler publishes the row once it is older than its grace.
    h.clock.set(row.updated_at_ms + 16_000)
    counts = await h.sweeper().sweep_once()
    assert counts["republished"] == 1
    assert await _entries(h) == 1
    assert (await _the_instance(h)).status is Status.DISPATCHED
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]


async def test_a_tick_whose_decision_could_not_be_recorded_is_recorded_once_as_run(
    outage_server: Harness,
) -> None:
    """The instance is created and published, then recording the decision fails (its INSERT
    waits for this test's lock on the decisions table, and its connection is killed): the
    next pass records the run, not a duplicate of it."""
    h = outage_server
    _, scheduler = await _first_pass(h)
    h.clock.set(M0 + 1000)
    await _pass_whose_record_fails(h, scheduler)
    assert await _decisions(h) == []
    await scheduler.run_pass()

    row = await _the_instance(h)
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]
    assert await _entries(h) == 1


async def test_a_waiting_tick_whose_record_failed_is_recorded_at_the_next_pass(
    outage_server: Harness,
) -> None:
    h = outage_server
    h.clock.set(M0 - 1)
    await h.apply(WAITS)
    scheduler = _scheduler(h, h.outbox)
    await scheduler.run_pass()
    h.clock.set(M0 + 1000)
    await _pass_whose_record_fails(h, scheduler)

    await scheduler.run_pass()
    await scheduler.run_pass()

    assert await _decisions(h) == [(verdict.WAIT_DEP, None)]


async def test_a_pass_ends_only_after_every_task_ended_even_when_one_failed(
    outage_server: Harness,
) -> None:
    """Task `minutely` fails (recording its decision fails) while task `gated` is still in its
    precondition check: the pass raises only once `gated` is decided too, so no task is left
    deciding in the background while the next pass starts."""
    h = outage_server
    entered, release = asyncio.Event(), asyncio.Event()

    async def gate(task_id: str, business_date: str) -> str:
        entered.set()
        await release.wait()
        return "pass"

    h.clock.set(M0 - 1)
    await h.apply(TASKS + GATED)
    scheduler = Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), checks={"gate": gate})
    await scheduler.run_pass()
    h.clock.set(M0 + 1000)
    async with h.store.engine.connect() as conn:
        await conn.execute(text("LOCK TABLES trigger_decisions WRITE"))
        passing = asyncio.create_task(scheduler.run_pass())
        await entered.wait()
        await kill_waiter(conn, "INSERT INTO trigger_decisions%", release=False)
        await conn.execute(text("UNLOCK TABLES"))
    release.set()
    with pytest.raises(StoreUnavailable):
        await passing

    gated = await h.store.decisions("gated", limit=10)
    assert [(d.fire_time_ms, d.decision) for d in gated] == [(M0, verdict.SHOULD_RUN)]


async def test_after_a_failed_cursor_write_the_next_wake_is_the_next_fire_time(
    outage_server: Harness,
) -> None:
    """The tick is decided and recorded, then the cursor write fails (its UPDATE waits for
    this test's row lock and its connection is killed). The next pass has nothing left to
    decide and must name the next fire time, not the decided one (a wake-up in the past would
    make the scheduler loop without sleeping)."""
    h = outage_server
    _, scheduler = await _first_pass(h)
    h.clock.set(M0 + 1000)
    await _pass_whose_cursor_write_fails(h, scheduler)
    h.clock.set(M0 + 2000)

    next_due = await scheduler.run_pass()

    assert next_due == M0 + 60_000
    row = await _the_instance(h)
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]


async def test_a_tick_left_waiting_by_a_stopped_scheduler_keeps_waiting_for_its_marker(
    h: Harness,
) -> None:
    """A tick waits for its marker; its scheduler stops; the window closes before the next
    one starts. The successor knows the tick was waiting (from the explain log), so it ends
    `skip_dep` instead of running, without the marker, as a late tick caught up."""
    await h.apply(WAITS_5M)
    h.clock.set(M0 - 1)
    await _scheduler(h, h.outbox).run_pass()
    h.clock.set(M0 + 1000)
    await _scheduler(h, h.outbox).run_pass()
    assert await _decisions(h) == [(verdict.WAIT_DEP, None)]

    h.clock.set(M0 + 6 * 60_000)  # the 5-minute window has closed
    await _scheduler(h, h.outbox).run_pass()

    assert await _decisions(h) == [(verdict.WAIT_DEP, None), (verdict.SKIP_DEP, None)]
    assert await h.store.list_instances(limit=10) == []


async def test_a_successor_does_not_decide_again_a_tick_decided_past_the_cursor(
    outage_server: Harness,
) -> None:
    """The tick is recorded but the cursor write fails; a new scheduler (a restart, a new
    leader) reads the decision back instead of deciding the tick a second time."""
    h = outage_server
    outbox, scheduler = await _first_pass(h)
    h.clock.set(M0 + 1000)
    await _pass_whose_cursor_write_fails(h, scheduler)

    await _scheduler(h, outbox).run_pass()

    row = await _the_instance(h)
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]


async def test_a_replacing_run_that_could_not_be_created_leaves_the_previous_one_running(
    h: Harness,
) -> None:
    """`concurrency: replace`: the new tick's instance cannot be created (store refused), so
    the previous run is not cancelled; the next pass creates the new one and cancels it."""
    await h.apply(REPLACES)
    h.clock.set(M0 - 1)
    outbox = h.outbox
    scheduler = _scheduler(h, outbox)
    await scheduler.run_pass()
    h.clock.set(M0 + 1000)
    await scheduler.run_pass()
    first = await _the_instance(h)
    h.clock.set(M0 + 61_000)
    await _pass_whose_creation_fails(outbox, scheduler)
    assert (await h.store.get_instance(first.id)) == first

    await scheduler.run_pass()

    rows = {r.scheduled_for_ms: r for r in await h.store.list_instances(limit=10)}
    assert (rows[M0].status, rows[M0].fail_class) == (Status.FAILED, FailClass.REPLACED)
    assert rows[M0 + 60_000].status is Status.DISPATCHED


async def test_a_late_tick_that_catch_up_deferred_runs_at_its_held_start(h: Harness) -> None:
    """The 20:27 tick (window 5 min) is first decided at 20:37: catch-up admits it (max_delay
    1 h) and `not_before: 20:50` defers it. Decided again at 20:50 it keeps its catch-up
    window, so it runs, instead of `skip_window` against its 5-minute window."""
    await h.apply(LATE_AND_HELD)
    h.clock.set(M0 - 1)
    scheduler = _scheduler(h, h.outbox)
    await scheduler.run_pass()
    h.clock.set(M0 + 10 * 60_000)
    await scheduler.run_pass()
    h.clock.set(M0 + 23 * 60_000 + 10)

    await scheduler.run_pass()

    [row] = await h.store.list_instances(limit=10)
    assert await _decisions(h) == [(verdict.DEFERRED, None), (verdict.SHOULD_RUN, row.id)]


async def test_a_missed_tick_left_pending_by_a_failed_pass_is_skipped(h: Harness) -> None:
    """A pass that created the record of a missed tick but failed before moving it to SKIPPED
    leaves it PENDING; the next pass finishes the move, so the reconciler never publishes (and
    so runs) a tick that was decided missed."""
    await h.apply(NO_CATCHUP)
    h.clock.set(M0 - 1)
    scheduler = _scheduler(h, h.outbox)
    await scheduler.run_pass()
    [spec] = [s for s in await h.definitions() if s.id == "minutely"]
    await h.store.create_instance(missed_instance(spec, M0))
    h.clock.set(M0 + 45_000)  # the tick's 30 s window has closed: missed

    await scheduler.run_pass()

    [row] = await h.store.list_instances(limit=10)
    assert (row.status, row.dedupe_key.startswith("missed:")) == (Status.SKIPPED, True)
    assert await _decisions(h) == [(verdict.MISSED, row.id)]


async def test_a_leader_whose_token_counter_redis_lost_schedules_again_at_once(
    h: Harness,
) -> None:
    """The cursors were written with token 1000 (many leaders ago); Redis restarts empty, so
    its token counter starts again from 1. The first new leader's token is above 1000, not
    rejected as stale until the counter climbs back."""
    await h.apply(TASKS)
    lease = LeaderLease(h.redis, h.keys, "s1", lease_ms=10_000)
    scheduler = Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), leader=lease)
    h.clock.set(M0 - 1)
    await scheduler.run_pass()
    assert await h.store.set_cursor("minutely", M0 - 1, token=1000)
    await h.redis.delete(h.keys.leader, h.keys.leader_epoch)  # Redis restarted empty
    h.clock.set(M0 + 1000)

    for _ in range(2):
        await scheduler._step()

    assert (await h.store.get_cursor("minutely") or 0) >= M0
    assert lease.token is not None and lease.token > 1000
    row = await _the_instance(h)
    assert await _decisions(h) == [(verdict.SHOULD_RUN, row.id)]


@pytest.mark.parametrize("restart", [False, True])
async def test_a_long_outage_is_summarised_once_when_the_cursor_write_failed(
    outage_server: Harness, restart: bool
) -> None:
    """After three hours down, the minutes older than the catch-up horizon are summarised in
    one `missed` record; then the cursor write fails. The next pass (of the same scheduler,
    or of one started afresh) must not record a second summary for the same outage, named
    after the minute after the first one."""
    h = outage_server
    _, scheduler = await _first_pass(h)
    h.clock.set(M0 + 3 * 3_600_000)
    await _pass_whose_cursor_write_fails(h, scheduler)
    if restart:
        scheduler = _scheduler(h, h.outbox)
    h.clock.set(M0 + 3 * 3_600_000 + 1000)

    await scheduler.run_pass()

    rows = await h.store.decisions("minutely", since_ms=M0, limit=1000)
    summaries = [r for r in rows if r.reason.endswith("older than the catch-up horizon")]
    assert [(r.fire_time_ms, r.decision) for r in summaries] == [(M0, verdict.MISSED)]
