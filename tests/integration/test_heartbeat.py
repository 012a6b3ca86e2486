"""The heartbeat of one executor process: each run's lease is extended by its own length, runs
are tracked by claim (instance id, token), and the beat loop outlives an unexpected error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.exceptions import ReadOnlyError

from taskstream.core import streams
from taskstream.core.states import Status
from taskstream.executor.heartbeat import Heartbeat
from taskstream.executor.intake import Run
from tests.integration.harness import Harness
from tests.integration.outages import intake, lease_end

LEASES = """
tasks:
  - id: short
    agent: slow
    lease: 10s
    payload: {seconds: 0}
  - id: long
    agent: slow
    lease: 600s
    payload: {seconds: 0}
  - id: again
    agent: slow
    lease: 60s
    retry: {max_attempts: 3}
    payload: {seconds: 0}
"""


async def _forever() -> None:
    await asyncio.Event().wait()


@pytest.fixture
def tasks() -> Iterator[list[asyncio.Task[None]]]:
    """Stand-ins for runs whose agents are still running; cancelled after the test."""
    made: list[asyncio.Task[None]] = []
    yield made
    for task in made:
        task.cancel()


def _running(made: list[asyncio.Task[None]]) -> asyncio.Task[None]:
    made.append(asyncio.create_task(_forever()))
    return made[-1]


async def _claim(h: Harness, task_id: str) -> Run:
    await h.trigger(LEASES, task_id, fire_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    return run


async def test_each_lease_is_extended_by_its_own_runs_lease_length(
    outage: Harness, tasks: list[asyncio.Task[None]]
) -> None:
    """A 10 s lease beside a 600 s one: the long lease is not cut to the short one's length
    (it would lapse between extensions once the short run ended), nor the short one stretched
    (a lost short run would wait ten minutes for the sweeper)."""
    h = outage
    await h.apply(LEASES)
    short, long = await _claim(h, "short"), await _claim(h, "long")
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    heartbeat.track(short, _running(tasks))
    heartbeat.track(long, _running(tasks))
    before = await h.store.db_now_ms()
    await heartbeat.extend()
    after = await h.store.db_now_ms()
    assert before + 10_000 <= await lease_end(h, short.row.id) <= after + 10_000
    assert before + 600_000 <= await lease_end(h, long.row.id) <= after + 600_000
    assert not (short.fenced or long.fenced)


async def test_a_newer_claim_of_an_instance_is_tracked_apart_from_its_fenced_run(
    outage: Harness, tasks: list[asyncio.Task[None]]
) -> None:
    """Run 1 of an instance was timed out and its retry was claimed by this same process while
    run 1 still runs: run 1 is fenced and cancelled, run 2 keeps its lease, and run 1 ending
    does not stop run 2 from being tracked."""
    h = outage
    await h.apply(LEASES)
    first = await _claim(h, "again")
    instance_id = first.row.id
    moved = await h.store.transition(
        instance_id, Status.RUNNING, Status.TIMEOUT, reason="lease_expired", attempt=1
    )
    assert moved.ok
    moved = await h.store.transition(
        instance_id,
        Status.TIMEOUT,
        Status.RETRYING,
        reason="after_lease_expired",
        attempt=1,
        next_attempt_at_ms=h.clock.now_ms(),
    )
    assert moved.ok
    retry = await h.store.get_instance(instance_id)
    assert retry is not None
    await h.outbox.publish(retry, now_ms=h.clock.now_ms())
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [second] = await (await intake(h, "c1")).admit([delivery])
    assert (second.row.id, second.token) == (instance_id, 2)

    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
    old, new = _running(tasks), _running(tasks)
    heartbeat.track(first, old)
    heartbeat.track(second, new)
    await heartbeat.extend()
    assert (first.fenced, second.fenced) == (True, False)
    with pytest.raises(asyncio.CancelledError):
        await old
    assert not new.done()
    heartbeat.untrack(first)
    assert (heartbeat.holds(instance_id, 1), heartbeat.holds(instance_id, 2)) == (False, True)


async def test_the_beat_loop_outlives_an_unexpected_error(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply the loop has no rule for (READONLY from a replica after a failover) is logged
    and the next beat runs: a dead heartbeat would let every lease lapse while the process
    kept claiming."""
    h = outage
    calls: list[int] = []
    beat_again = asyncio.Event()
    mark_alive = streams.mark_alive

    async def flaky(redis: streams.Redis, keys: object, consumer: str, ttl_ms: int) -> None:
        calls.append(ttl_ms)
        if len(calls) == 1:
            raise ReadOnlyError("You can't write against a read only replica.")
        await mark_alive(redis, h.keys, consumer, ttl_ms)
        beat_again.set()

    monkeypatch.setattr(streams, "mark_alive", flaky)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=0.6)
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await asyncio.wait_for(beat_again.wait(), timeout=20)
        assert not loop.done()
        assert await h.redis.exists(h.keys.alive("c1")) == 1
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=20)


async def test_beats_come_often_enough_for_the_shortest_lease_held(
    outage: Harness, tasks: list[asyncio.Task[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a long liveness TTL (60 s: a beat every 20 s) a run with a 10 s lease would lapse
    between beats, and the sweeper would time out a healthy run. Tracking it wakes the
    sleeping beat loop, and beats then come every third of that lease."""
    h = outage
    await h.apply(LEASES)
    beats: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]
    mark_alive = streams.mark_alive

    async def counted(redis: streams.Redis, keys: object, consumer: str, ttl_ms: int) -> None:
        await mark_alive(redis, h.keys, consumer, ttl_ms)
        next((beat for beat in beats if not beat.is_set()), asyncio.Event()).set()

    monkeypatch.setattr(streams, "mark_alive", counted)
    heartbeat = Heartbeat(h.store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=60)
    assert heartbeat.interval_s == 20
    stop = asyncio.Event()
    loop = asyncio.create_task(heartbeat.run(stop))
    try:
        await asyncio.wait_for(beats[0].wait(), timeout=20)  # then it sleeps 20 s
        short = await _claim(h, "short")
        heartbeat.track(short, _running(tasks))
        assert heartbeat.interval_s == pytest.approx(10 / 3)
        await asyncio.wait_for(beats[1].wait(), timeout=5)  # bounds a broken run only
        heartbeat.untrack(short)
        assert heartbeat.interval_s == 20
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=20)
