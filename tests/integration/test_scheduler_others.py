"""Ticks meeting what the scheduler did not decide for them, on real Redis and a real store
(clock passed in): an earlier tick's instance under a key several ticks share, an operator's
run at a fire time across a restart."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import manual
from taskstream.scheduler.instances import new_instance
from tests.integration.harness import Harness
from tests.integration.test_scheduler import make

FRI = 1_780_012_800_000
"""2026-05-29T00:00:00Z, a Friday."""
MIN = 60_000
HOUR = 60 * MIN


@pytest.mark.parametrize("concurrency", ["allow", "replace"])
async def test_a_later_tick_of_a_business_date_is_a_duplicate_of_the_days_run(
    store: SqlStore, redis: streams.Redis, keys: Keys, concurrency: str
) -> None:
    """`{task_id}:{business_date}`: the 01:00 tick makes the day's instance; the 02:00 tick
    finds it. It is not the 02:00 tick's own (made for 01:00), so it is a duplicate, and
    `replace` must not cancel it as the previous run."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: d, agent: echo, schedule: {every: 1h, timezone: UTC}, window: 5m,"
        f" concurrency: {concurrency}, dedupe_key: '{{task_id}}:{{business_date}}'}}\n"
    )
    s = make(h)
    await s.run_pass()
    for hour in (1, 2):
        h.clock.set(FRI + hour * HOUR + 1_000)
        await s.run_pass()
    got = {d.fire_time_ms: d.decision for d in await store.decisions("d", limit=10)}
    assert got == {FRI + HOUR: "should_run", FRI + 2 * HOUR: "skip_duplicated"}
    [row] = await store.list_instances(task_id="d")
    assert (row.scheduled_for_ms, row.status) == (FRI + HOUR, Status.DISPATCHED)


async def test_catch_up_of_a_business_date_records_only_the_ticks_own_instance(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A leader made the 01:00 instance and died before recording it; the next one comes at
    03:30. Only 01:00 ran (`recorded_after_creation`); 02:00 and 03:00 shared its key but
    are not it, so catch-up decides them (`latest`: 03:00 runs into the existing key)."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: d, agent: echo, schedule: {every: 1h, timezone: UTC}, window: 5m,"
        " dedupe_key: '{task_id}:{business_date}', catchup: {max_delay: 6h}}\n"
    )
    await make(h).run_pass()
    [spec] = await h.definitions()
    made = await h.outbox.emit(new_instance(spec, FRI + HOUR), now_ms=h.clock.now_ms())
    h.clock.set(FRI + 3 * HOUR + 30 * MIN)
    await make(h).run_pass()
    got = {
        (d.fire_time_ms - FRI) // HOUR: (d.decision, d.details.get("recorded_after_creation"))
        for d in await store.decisions("d", limit=10)
    }
    assert got[1] == ("should_run", True)
    assert got[2] == ("coalesced", None)
    assert got[3] == ("skip_duplicated", None)
    assert [r.id for r in await store.list_instances(task_id="d")] == [made.instance_id]


@pytest.mark.parametrize("restart", [False, True])
async def test_an_operators_run_at_a_fire_time_does_not_decide_the_tick(
    store: SqlStore, redis: streams.Redis, keys: Keys, restart: bool
) -> None:
    """An operator runs the US variant of the coming tick by hand (its own dedupe key); the
    tick still makes its EU instance, whether or not the scheduler restarted in between (a
    restarted one reads the decisions back, the operator's row among them)."""
    h = Harness(store, redis, keys, FixedClock(FRI + HOUR - 1_000))
    await h.apply(
        "tasks:\n  - {id: r, agent: echo, schedule: {every: 1h}, window: 5m,"
        " dedupe_key: '{task_id}:{scheduled_for}:{payload.region}', payload: {region: eu}}\n"
    )
    s = make(h)
    await s.run_pass()
    [spec] = await h.definitions()
    now = h.clock.now_ms()
    await manual.trigger(h.outbox, spec, now_ms=now, payload={"region": "us"}, at_ms=FRI + HOUR)
    if restart:
        s = make(h)
    h.clock.set(FRI + HOUR + 1_000)
    await s.run_pass()
    rows = await store.list_instances(task_id="r")
    assert sorted(r.payload["region"] for r in rows) == ["eu", "us"]
