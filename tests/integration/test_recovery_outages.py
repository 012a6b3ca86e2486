"""Leases and the sweeper across failures, on real Redis and a real store: a lease extension
the store refused is tried again at the next beat, the heartbeat leaves a run whose end is
committing to its commit, and a poison entry whose move to the dead-letter stream failed is
moved there by the sweeper."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import GROUP, Priority
from taskstream.core.reasons import OWNER_LOST, after
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, FinishRequest
from taskstream.executor.heartbeat import Heartbeat
from taskstream.scheduler.instances import new_instance
from tests.integration.harness import T0, Harness, until
from tests.integration.outages import (
    LEASE_READ,
    TASKS,
    Gate,
    claimed_unrun,
    forever,
    gated_executor,
    intake,
    kill_waiter,
    lease_end,
    lock,
    settled,
)


async def test_a_lease_extension_the_store_refused_is_tried_again_at_the_next_beat(
    outage_server: Harness,
) -> None:
    """A third of the lease (30 s) has passed, and the heartbeat's extension fails (its
    connection is killed while it waits for a row lock): the next beat extends the lease,
    rather than a third of a lease later."""
    h = outage_server
    gate = Gate()
    instance_id, ex = await gated_executor(h, gate, liveness_ttl_s=0.6)  # a beat every 0.2 s
    try:
        await asyncio.wait_for(gate.started.wait(), timeout=20)
        h.clock.advance(11_000)
        async with h.store.engine.connect() as conn:
            await lock(conn, instance_id)
            await kill_waiter(conn, LEASE_READ)
        before = await lease_end(h, instance_id)

        async def extended() -> bool:
            return await lease_end(h, instance_id) > before

        await until(extended)
        gate.release.set()
        await settled(h, instance_id)
    finally:
        gate.release.set()
        await ex.close()


async def test_the_heartbeat_fences_a_running_run_but_not_one_whose_end_is_committing(
    outage: Harness,
) -> None:
    """Runs stay tracked until their end is committed. Both rows below have left RUNNING at
    their tokens: the run whose agent still runs is fenced and cancelled; the run whose agent
    returned is left to its commit, which decides (and logs) the outcome."""
    h = outage
    for i in range(2):
        await h.trigger(TASKS, "quick", fire_ms=h.clock.now_ms() + i)
    deliveries = await streams.read(h.redis, h.keys, "c1", count=2, block_ms=10)
    running, committing = await (await intake(h, "c1")).admit(deliveries)
    await h.store.finish_many(
        [
            FinishRequest(r.row.id, r.token, Status.SUCCESS, "done", owner="c1")
            for r in (running, committing)
        ]
    )
    returned = asyncio.create_task(asyncio.sleep(0))
    await returned
    busy = asyncio.create_task(forever())
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    heartbeat.track(running, busy)
    heartbeat.track(committing, returned)
    await heartbeat.extend()
    assert (running.fenced, committing.fenced) == (True, False)
    with pytest.raises(asyncio.CancelledError):
        await busy


async def test_a_poison_entry_whose_dead_letter_failed_is_moved_there_by_the_sweeper(
    outage: Harness,
) -> None:
    """The executor committed FAILED `poison`, then Redis failed before the entry moved to the
    dead-letter stream: the sweeper moves it there instead of acknowledging it, with the
    reason the history records (`payload_too_large`), as the executor would have."""
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    poison = FinishRequest(
        instance_id, 1, Status.FAILED, "payload_too_large", fail_class=FailClass.POISON
    )
    assert (await h.store.finish_many([poison]))[instance_id].ok
    counts = await h.sweeper().sweep_once()  # "c1" has no liveness key: taken at once
    assert counts.get("dead_letter") == 1
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [(f[b"reason"], f[b"source_id"].decode()) for _, f in dead] == [
        (b"payload_too_large", delivery.entry_id)
    ]
    assert (await h.redis.xpending(delivery.stream, GROUP))["pending"] == 0


async def test_a_duplicate_read_by_a_consumer_now_gone_does_not_end_the_run(
    outage: Harness,
) -> None:
    """`c1` runs the instance (alive, lease held). A second entry of the same attempt was
    read by `c2`, which lost the claim and then went away: the sweeper acks that duplicate
    and leaves `c1`'s run alone, instead of timing it out as if its owner were lost."""
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    await streams.mark_alive(h.redis, h.keys, "c1", ttl_ms=60_000)
    await h.redis.xadd(delivery.stream, dict(delivery.fields))
    [duplicate] = await streams.read(h.redis, h.keys, "c2", count=1, block_ms=10)
    before = await h.store.get_instance(instance_id)

    counts = await h.sweeper().sweep_once()

    assert counts.get("ack") == 1
    assert counts.get("timeout") is None
    assert await h.store.get_instance(instance_id) == before
    pending: Any = await h.redis.xpending_range(delivery.stream, GROUP, "-", "+", 10)
    assert [(p["message_id"].decode(), p["consumer"].decode()) for p in pending] == [
        (delivery.entry_id, "c1")
    ]
    assert duplicate.entry_id != delivery.entry_id


async def test_leases_are_extended_while_redis_is_down(outage: Harness) -> None:
    """Redis is down (the entries cannot be touched), but the leases live in the store,
    which answers: a lease beat extends them, and the Redis error is reported after."""
    h = outage
    instance_id, delivery = await claimed_unrun(h, "c1")
    [run] = await (await intake(h, "c1")).admit([delivery])  # adopted: its claim is ours
    dead = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    beat = Heartbeat(h.store, dead, h.keys, "c1", h.clock, liveness_ttl_s=6)

    async def running() -> None:
        await asyncio.Event().wait()

    holder = asyncio.create_task(running())
    beat.track(run, holder)
    lease_s = run.spec.effective_lease_s if run.spec else 0
    try:
        before = await h.store.db_now_ms()
        with pytest.raises(streams.DRIVER_ERRORS):
            await beat.beat()
        assert await lease_end(h, instance_id) >= before + lease_s * 1000
        assert not run.fenced
    finally:
        holder.cancel()
        await dead.aclose()


async def test_right_after_redis_failed_an_absent_liveness_key_does_not_end_a_run(
    outage: Harness,
) -> None:
    """Liveness keys expire during a Redis outage longer than their TTL, live executors'
    too. For one TTL after the sweeper saw Redis fail it judges runs by their leases alone;
    after that an absent key means a lost owner again."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")  # "c1" has no liveness key
    sweeper = h.sweeper(liveness_ttl_ms=6_000)
    sweeper.redis_failed()
    before = await h.store.get_instance(instance_id)

    counts = await sweeper.sweep_once()

    assert counts.get("timeout") is None
    assert await h.store.get_instance(instance_id) == before
    h.clock.advance(6_000)
    assert (await sweeper.sweep_once()).get("timeout") == 1


async def test_a_sweeper_that_just_started_does_not_end_a_run_for_an_absent_liveness_key(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper started while Redis was down (a host rebooted, its container came back
    first) has seen no failure: it would time out at once every run whose executor lost its
    key in the outage, though those executors live and set it again within a TTL. So for
    one TTL after its start it judges runs by their leases alone, as after a Redis failure."""
    h = outage
    instance_id, _ = await claimed_unrun(h, "c1")  # "c1" has no liveness key
    before = await h.store.get_instance(instance_id)
    sweeper = h.sweeper(liveness_ttl_ms=6_000, interval_s=0.01)
    passes = 0
    sweep_once = sweeper.sweep_once

    async def counted() -> dict[str, int]:
        nonlocal passes
        counts = await sweep_once()
        passes += 1
        return counts

    async def status() -> Status | None:
        row = await h.store.get_instance(instance_id)
        return None if row is None else row.status

    async def swept(n: int) -> bool:
        return passes >= n

    monkeypatch.setattr(sweeper, "sweep_once", counted)
    stop = asyncio.Event()
    task = asyncio.create_task(sweeper.run(stop))
    try:
        await until(lambda: swept(2))
        assert await h.store.get_instance(instance_id) == before
        h.clock.advance(6_000)
        await until(lambda: _not_running(status))
    finally:
        stop.set()
        await task


async def _not_running(status: Callable[[], Awaitable[Status | None]]) -> bool:
    return await status() is not Status.RUNNING


@pytest.mark.parametrize("status", [Status.PENDING, Status.RETRYING])
async def test_a_poison_entry_of_a_row_not_yet_dispatched_fails_the_instance(
    outage: Harness, status: Status
) -> None:
    """The row is still PENDING or RETRYING (the outbox's CAS to DISPATCHED never happened)
    and its entry was delivered more than `max_deliveries` times to a consumer now gone: the
    instance goes FAILED `poison` through DISPATCHED (its entry was on the stream), rather
    than staying for the reconciler to publish again."""
    h = outage
    spec = next(s for s in await h.definitions() if s.id == "quick")
    new = new_instance(spec, T0)
    await h.store.create_instance(new)
    if status is Status.RETRYING:  # attempt 1 ran and failed; its retry was published
        await h.store.transition(new.id, Status.PENDING, Status.DISPATCHED, reason="t")
        await h.store.claim_many([ClaimRequest(new.id, 0, 60)], owner="c0")
        await h.store.transition(new.id, Status.RUNNING, Status.RETRYING, reason="t", attempt=1)
    row = await h.store.get_instance(new.id)
    assert row is not None and row.status is status
    await streams.publish(h.redis, h.keys, Priority.DEFAULT, row_entry(row, T0))
    stream = h.keys.stream(Priority.DEFAULT)
    for _ in range(7):  # read from id 0: each is one more delivery
        await h.redis.xreadgroup(GROUP, "gone", {stream: "0" if _ else ">"})

    counts = await h.sweeper(max_deliveries=5).sweep_once()

    assert counts.get("poison") == 1
    row = await h.store.get_instance(new.id)
    assert row is not None and (row.status, row.fail_class) == (Status.FAILED, FailClass.POISON)
    assert [(x.from_status, x.to_status) for x in await h.store.history(new.id)][-2:] == [
        (status, Status.DISPATCHED),
        (Status.DISPATCHED, Status.FAILED),
    ]


async def test_a_timeout_whose_second_move_failed_is_finished_with_its_own_cause(
    outage: Harness,
) -> None:
    """The only run (max_attempts 1) lost its executor; the sweeper committed RUNNING ->
    TIMEOUT (`owner_lost`), and the store failed (or the reply was lost) before TIMEOUT ->
    FAILED. The next pass finishes the move from the run's entry, still pending: every run
    lost its owner, so poison, as when the sweeper's move is not interrupted, with the
    history saying `after_owner_lost` and the entry dead-lettered, not acked."""
    h = outage
    instance_id, delivery = await claimed_unrun(h, "gone")
    first = await h.store.transition(
        instance_id, Status.RUNNING, Status.TIMEOUT, reason=OWNER_LOST, attempt=1, owner="gone"
    )
    assert first.ok
    h.clock.advance(60_000)
    counts = await h.sweeper().sweep_once()
    done = await h.store.get_instance(instance_id)
    assert done is not None
    assert (done.status, done.fail_class) == (Status.FAILED, FailClass.POISON)
    assert (await h.store.history(instance_id))[-1].reason == after(OWNER_LOST)
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"poison"], counts
    assert (await h.redis.xpending(delivery.stream, GROUP))["pending"] == 0


SHORT_LEASE = """
tasks:
  - id: short
    agent: slow
    lease: 10s
    payload: {seconds: 0}
"""


@pytest.mark.parametrize("deliveries", [1, 9])
async def test_a_lease_extended_after_the_sweepers_read_leaves_the_run(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, deliveries: int
) -> None:
    """The sweeper reads a run whose lease has run out; its owner's heartbeat then extends
    the lease before the sweeper moves. The run is left to its owner, whether the verdict
    was a timeout or, with the entry delivered too often already, poison."""
    h = outage
    await h.apply(SHORT_LEASE)
    await h.trigger(SHORT_LEASE, "short", fire_ms=h.clock.now_ms())
    [d] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([d])
    if deliveries > 1:  # earlier deliveries of this entry (readers that crashed before)
        await h.redis.xclaim(d.stream, GROUP, "c1", 0, [d.entry_id], retrycount=deliveries)
    h.clock.set(h.clock.now_ms() + 11_000)  # the lease as the sweeper reads it has run out
    get_instance = h.store.get_instance

    async def read_then_beat(instance_id: str) -> Any:
        row = await get_instance(instance_id)
        assert await h.store.extend_lease(instance_id, token=run.token, lease_s=60)
        return row

    monkeypatch.setattr(h.store, "get_instance", read_then_beat)
    await h.sweeper(min_idle_ms=0).sweep_once()
    monkeypatch.undo()
    row = await h.store.get_instance(run.row.id)
    assert row is not None
    assert (row.status, row.fail_class) == (Status.RUNNING, None)
