"""Keeping a process's clock on the database's: a step of the host's wall clock between two
resyncs does not move it, and a stop ends the resync loop without one more read of the
database clock (a database that stopped answering would hold the exit up)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core import clock as clock_module
from taskstream.core import streams, timesync
from taskstream.core.errors import StoreUnavailable
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.core.timesync import keep_synced, synced_clock
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import Harness, until
from tests.support.stepped_time import SteppedTime, stepped_host

HOUR_MS = 3_600_000


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> SteppedTime:
    return stepped_host(monkeypatch)


async def test_a_wall_clock_step_does_not_move_the_synced_clock(
    store: SqlStore, host: SteppedTime
) -> None:
    clock = await synced_clock(store)
    for step_ms in (120_000, -60_000):
        host.step_ms = step_ms
        before = await store.db_now_ms()
        now = clock.now_ms()
        after = await store.db_now_ms()
        # A few ms of sync error and rounding either way, nowhere near the step.
        assert before - 50 <= now <= after + 50, (step_ms, before, now, after)


async def test_a_forward_step_of_the_scheduler_host_fires_no_tick_early(
    store: SqlStore, redis: streams.Redis, keys: Keys, host: SteppedTime
) -> None:
    """The scheduler host's wall clock steps past the next hourly fire time, which by the
    database clock is still ahead: the pass fires nothing."""
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    await h.apply("tasks:\n  - {id: hourly, agent: echo, schedule: {every: 1h, timezone: UTC}}\n")
    clock = await synced_clock(store)
    scheduler = Scheduler(store, h.outbox, clock, SchedulerConfig())
    await scheduler.run_pass()
    before = {r.id for r in await store.list_instances(task_id="hourly")}
    now = clock.now_ms()
    host.step_ms = (now // HOUR_MS + 1) * HOUR_MS - now + 1_000
    await scheduler.run_pass()
    db_now = await store.db_now_ms()
    early = [
        r.scheduled_for_ms
        for r in await store.list_instances(task_id="hourly")
        if r.id not in before and (r.scheduled_for_ms or 0) > db_now
    ]
    assert early == [], f"database now {db_now}; fired ahead of it: {early}"


class _SameHost(SqlStore):
    """The real store, on the host whose wall clock `host` steps (SQLite, or a server beside
    the role): its clock steps with the host's."""

    host = SteppedTime()

    async def db_now_ms(self) -> int:
        return await super().db_now_ms() + self.host.step_ms

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        now, before, after = await super().clock_sample(host_ms)
        return now + self.host.step_ms, before, after


async def test_a_step_of_the_database_hosts_clock_is_followed_within_seconds(
    db_url: str, host: SteppedTime
) -> None:
    store = await _SameHost.connect(db_url)
    store.host = host
    try:
        clock = await synced_clock(store)
        stop = asyncio.Event()
        syncing = asyncio.create_task(keep_synced(store, clock, stop))
        try:
            host.step_ms = 120_000
            await until(lambda: _agree(store, clock), timeout_s=10)
        finally:
            stop.set()
            await asyncio.wait_for(syncing, timeout=5)
    finally:
        await store.close()


async def _agree(store: SqlStore, clock: clock_module.OffsetClock) -> bool:
    before = await store.db_now_ms()
    now = clock.now_ms()
    return before - 50 <= now <= await store.db_now_ms() + 50


class _Down(SqlStore):
    """The real store, down: every read of its clock fails, and is counted."""

    reads = 0

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        self.reads += 1
        raise StoreUnavailable("store: down")


async def test_a_step_during_an_outage_asks_the_store_once_not_every_second(
    db_url: str, host: SteppedTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timesync, "STEP_CHECK_S", 0.01)
    store = await _Down.connect(db_url)
    clock = clock_module.OffsetClock()
    looks = 0
    wall_step_ms = clock.wall_step_ms

    def counted() -> int:
        nonlocal looks
        looks += 1
        return wall_step_ms()

    monkeypatch.setattr(clock, "wall_step_ms", counted)
    stop = asyncio.Event()
    syncing = asyncio.create_task(keep_synced(store, clock, stop))
    try:
        host.step_ms = 5_000

        async def looked_often() -> bool:
            return looks >= 30

        await until(looked_often)
        assert store.reads == 1
    finally:
        stop.set()
        await asyncio.wait_for(syncing, timeout=5)
        await store.close()


class _Counting(SqlStore):
    """The real store, counting its reads of the database clock."""

    reads = 0

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        self.reads += 1
        return await super().clock_sample(host_ms)


async def test_a_stop_ends_the_resync_without_reading_the_database_clock(db_url: str) -> None:
    store = await _Counting.connect(db_url)
    try:
        clock = await synced_clock(store)
        stop = asyncio.Event()
        syncing = asyncio.create_task(keep_synced(store, clock, stop))
        await asyncio.sleep(0)  # the loop is now waiting for its next resync
        store.reads = 0
        stop.set()
        await asyncio.wait_for(syncing, timeout=5)
        assert store.reads == 0
    finally:
        await store.close()


WAIT_S = 1.0


class _SlowToAnswer(SqlStore):
    """The real store, slow to answer: with `pool_wait`, every connection is handed out
    `WAIT_S` late (every pooled one busy); `stalls` reads of its clock are held up by the
    server after the database read its clock."""

    pool_wait = False
    stalls = 0

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        if self.pool_wait:
            await asyncio.sleep(WAIT_S)
        async with super()._read() as conn:
            yield conn

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        now, before, after = await super().clock_sample(host_ms)
        if self.stalls:
            self.stalls -= 1
            await asyncio.sleep(WAIT_S)  # the reply is late: the bracket ends later
            after = host_ms()
        return now, before, after


@pytest.mark.parametrize("slow", ["pool-wait", "server-stall"])
async def test_a_sync_whose_read_waited_does_not_put_the_clock_off(db_url: str, slow: str) -> None:
    """A read that waited for a connection, or one the server held up, would put the clock a
    second off (half the wait) for a minute, and due retries and ticks would go out early:
    the wait for a connection is outside the bracket, and of three reads the one with the
    shortest round trip sets the offset."""
    store = await _SlowToAnswer.connect(db_url)
    try:
        store.pool_wait, store.stalls = slow == "pool-wait", 1 if slow == "server-stall" else 0
        clock = await synced_clock(store)
        store.pool_wait = False
        before = await store.db_now_ms()
        now = clock.now_ms()
        after = await store.db_now_ms()
        assert before - 100 <= now <= after + 100, (before, now, after)
    finally:
        await store.close()
