"""Schedulers coming and going, on real Redis and a real store, clock passed in: two
schedulers without a lease make no duplicate, a standby fires the next tick when the leader
dies, a tick whose instance a dead leader made is recorded as run, a hint wakes a sleeping
scheduler, and a task whose advance fails does not stop the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from taskstream.core import notify, streams
from taskstream.core.clock import FixedClock, SystemClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.instances import new_instance
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import T0, Harness, until
from tests.integration.scheduler_cases import M0, make
from tests.support.databases import temp_database

EVERY_SECOND = "\n".join(
    f"  - {{id: t{i}, agent: echo, schedule: {{every: 1s}}, window: 1h}}" for i in range(20)
)


@pytest.fixture
async def maria(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    async with temp_database("mariadb") as url:
        store = await SqlStore.connect(url)
        try:
            yield Harness(store, redis, keys, FixedClock(T0 + 1))
        finally:
            await store.close()


async def test_two_schedulers_on_1000_fires_make_no_duplicate(maria: Harness) -> None:
    h = maria
    await h.apply("tasks:\n" + EVERY_SECOND)
    a, b = make(h), make(h)  # no lease: both decide every tick
    await asyncio.gather(a.run_pass(), b.run_pass())
    for _ in range(50):
        h.clock.advance(1000)
        await asyncio.gather(a.run_pass(), b.run_pass())
    rows = await h.store.list_instances(limit=5000)
    assert len(rows) == 1000
    assert len({(r.task_id, r.scheduled_for_ms) for r in rows}) == 1000
    total = sum([await h.redis.xlen(s) for s in h.keys.streams()])
    assert total == 1000


async def test_the_standby_fires_the_next_tick_when_the_leader_dies(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(T0 + 1))
    await h.apply("tasks:\n  - {id: tick, agent: echo, schedule: {every: 1s}, window: 1m}")
    leader, standby = make(h, "leader"), make(h, "standby")
    assert await leader._step() >= 0
    await standby._step()
    h.clock.advance(1000)
    await leader._step()
    await standby._step()
    assert len(await store.list_instances()) == 1
    await redis.delete(keys.leader)  # the leader died: its lease expired
    h.clock.advance(1000)
    await standby._step()
    rows = await store.list_instances()
    assert [r.scheduled_for_ms for r in rows] == [T0 + 1000, T0 + 2000]
    # The old leader comes back: its cursor writes carry an old token and are rejected.
    h.clock.advance(1000)
    await leader._step()
    assert len(await store.list_instances()) == 2
    await standby._step()
    assert len(await store.list_instances()) == 3


async def test_a_hint_wakes_a_sleeping_scheduler(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """With nothing due for 30 s, a run set to retry now is re-emitted at once after the
    executor's hint on the control channel, not at the end of the sleep."""
    from taskstream.core import notify
    from taskstream.core.clock import SystemClock

    h = Harness(store, redis, keys)
    await h.apply("tasks:\n  - {id: once, agent: echo}\n")
    row = await h.trigger("tasks:\n  - {id: once, agent: echo}\n", "once")
    await store.claim_many([ClaimRequest(row.id, 0, 60)], owner="x")
    scheduler = Scheduler(
        store,
        h.outbox,
        SystemClock(),
        SchedulerConfig(max_sleep_s=30),
        wakeups=notify.Wakeups(redis, keys),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        # Asleep after its first pass: it subscribes to the control channel only then. The
        # retry is due only from now on, so no pass but one a hint starts can emit it.
        async def asleep() -> bool:
            [(_, listeners)] = await redis.pubsub_numsub(keys.control)
            return int(listeners) >= 1

        await until(asleep, timeout_s=10)
        now = await store.db_now_ms()
        done = await store.finish_many(
            [FinishRequest(row.id, 1, Status.RETRYING, "t", next_attempt_at_ms=now)]
        )
        assert done[row.id].ok
        await notify.hint(redis, keys, "retry")

        async def re_emitted() -> bool:
            current = await store.get_instance(row.id)
            return current is not None and current.status is Status.DISPATCHED

        await until(re_emitted, timeout_s=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


TWO = """
tasks:
  - {id: broken, agent: echo, schedule: {every: 1m}}
  - {id: fine, agent: echo, schedule: {every: 1m}}
"""


async def test_a_task_whose_advance_fails_does_not_stop_the_others(
    store: SqlStore, redis: streams.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task's advance raises an error nobody expects (a defect, or a stored definition
    an older version accepted): it is logged and tried again next pass; `fine` runs, and
    the pass returns instead of ending the scheduler."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    await h.apply(TWO)
    s = make(h)
    advance = s._advancer.advance

    async def faulty(spec: Any, *args: Any, **kwargs: Any) -> int:
        if spec.id == "broken":
            raise ValueError("cannot make an instance")
        return await advance(spec, *args, **kwargs)

    monkeypatch.setattr(s._advancer, "advance", faulty)
    await s.run_pass()
    h.clock.advance(60_000)
    assert await s.run_pass() == M0 + 120_000
    assert [r.task_id for r in await store.list_instances()] == ["fine"]


@pytest.mark.parametrize("gone_for_ms", [3 * 60_000, 2 * 3_600_000])
async def test_a_tick_whose_instance_a_dead_leader_made_is_recorded_as_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, gone_for_ms: int
) -> None:
    """A leader created tick M0's instance, then died before recording the decision. The
    next leader comes after the window closed: catch-up would call the tick `coalesced`
    (a newer tick is on time) or `missed` (past `max_delay`), but it did run; the record
    says so and names the instance, and no `missed:` record is made for it."""
    h = Harness(store, redis, keys, FixedClock(M0 - 500))
    text = (
        "tasks:\n  - {id: minute, agent: echo, schedule: {every: 1m}, window: 1m,"
        " catchup: {mode: latest, max_delay: 1h}}\n"
    )
    await h.apply(text)
    s = make(h)
    await s.run_pass()
    spec = next(t for t in await h.definitions() if t.id == "minute")
    made = await h.outbox.emit(new_instance(spec, M0), now_ms=M0)
    h.clock.set(M0 + gone_for_ms + 500)
    await make(h).run_pass()
    [decision] = [d for d in await store.decisions("minute", since_ms=M0) if d.fire_time_ms == M0]
    assert (decision.decision, decision.instance_id) == ("should_run", made.instance_id)
    assert decision.details["recorded_after_creation"] is True
    row = await store.get_instance(made.instance_id)
    assert row is not None
    keys_made = {r.dedupe_key for r in await store.list_instances(limit=1000)}
    assert f"missed:{row.dedupe_key}" not in keys_made


async def test_a_standby_takes_over_at_once_when_the_leader_stops_cleanly(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The leader releases its 60 s lease as it stops and wakes the standby, which would
    otherwise try again only when its own wait (a third of the lease, 20 s) ends: due
    retries and ticks would wait that long in a rolling restart."""
    h = Harness(store, redis, keys)

    def scheduler(owner: str) -> Scheduler:
        lease = LeaderLease(redis, keys, owner, lease_ms=60_000)
        wakeups = notify.Wakeups(redis, keys)
        return Scheduler(
            store, h.outbox, SystemClock(), SchedulerConfig(), leader=lease, wakeups=wakeups
        )

    async def leads(owner: str) -> bool:
        held: Any = await redis.get(keys.leader)
        return streams.as_text(held or b"").startswith(owner + "|")

    async def both_listen() -> bool:
        [(_, listeners)] = await redis.pubsub_numsub(keys.control)
        return int(listeners) >= 2

    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = asyncio.create_task(scheduler("a").run(stop_a))
    await until(lambda: leads("a"))
    task_b = asyncio.create_task(scheduler("b").run(stop_b))
    try:
        await until(both_listen)
        stop_a.set()
        await asyncio.wait_for(task_a, timeout=10)
        await until(lambda: leads("b"), timeout_s=10)
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.wait_for(asyncio.gather(task_a, task_b, return_exceptions=True), 20)
