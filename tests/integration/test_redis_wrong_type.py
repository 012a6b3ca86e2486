"""A work stream's key holding another type of value (an operator's `SET` on it, another
application writing into the namespace): Redis answers WRONGTYPE to every stream command on
it. The roles log `redis.wrong_type` naming the key and its type, pause that stream's work
(longer at each try) and go on with the others; nothing stored is lost, and the stream's work
resumes once the key is deleted. Real Redis, real store."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from taskstream.cli.common import Cluster
from taskstream.cli.roles import _dependencies_up
from taskstream.core import redis_needs
from taskstream.core import streams_admin as admin
from taskstream.core.protocol import Priority
from taskstream.core.settings import Settings
from taskstream.core.states import Status
from taskstream.runtime.endpoint import Endpoints
from tests.integration.harness import Harness, Running, until

TASKS = """
tasks:
  - {id: t-low, agent: slow, priority: low, retry: {max_attempts: 1}, payload: {seconds: 0}}
  - {id: t-default, agent: slow, retry: {max_attempts: 1}, payload: {seconds: 0}}
"""
PAUSE_OVER_MS = 120_000
"""Past any pause after a try (at most 30 s) and the reconciler's grace (15 s)."""


async def _is(h: Harness, instance_id: str, status: Status) -> bool:
    row = await h.store.get_instance(instance_id)
    return row is not None and row.status is status


async def test_an_executor_reads_the_other_streams_past_a_key_of_another_type(
    outage: Harness,
) -> None:
    """The `low` key is overwritten with a string under a running executor (its blocked read
    meets NOGROUP, making the group again meets WRONGTYPE). It used to end the executor. It
    names the key, runs the other streams' work, and reads `low` again once it is deleted."""
    h = outage
    await h.apply(TASKS)
    low = h.keys.stream(Priority.LOW)
    with capture_logs() as logs:
        running = Running(h.executor())
        try:
            first = await h.trigger(TASKS, "t-default")
            await until(lambda: _is(h, first.id, Status.SUCCESS))
            await h.redis.set(low, "clobbered")
            second = await h.trigger(TASKS, "t-default", fire_ms=first.scheduled_for_ms + 1)

            async def second_done() -> bool:
                return running.task.done() or await _is(h, second.id, Status.SUCCESS)

            await until(second_done)
            assert not running.task.done(), repr(running.task.exception())
            told = [e for e in logs if e["event"] == "redis.wrong_type"]
            assert told and told[0]["key"] == low and told[0]["type"] == "string", logs
            await h.redis.delete(low)  # the operator's fix
            h.clock.advance(PAUSE_OVER_MS)
            third = await h.trigger(TASKS, "t-low", fire_ms=first.scheduled_for_ms + 2)
            await until(lambda: _is(h, third.id, Status.SUCCESS))
        finally:
            await running.close()


async def test_a_sweeper_pauses_its_reconciler_past_a_key_of_another_type(
    outage: Harness,
) -> None:
    """An instance whose publish met the key is PENDING in the store. The sweeper's pass
    used to end on WRONGTYPE (making the groups). It logs the key, pauses the reconciler
    (not its sweeps), and once the key is deleted publishes the instance."""
    h = outage
    await h.apply(TASKS)
    low = h.keys.stream(Priority.LOW)
    await h.redis.set(low, "clobbered")
    row = await h.trigger(TASKS, "t-low")
    assert row.status is Status.PENDING
    sweeper = h.sweeper(interval_s=0.05)
    stop = asyncio.Event()
    with capture_logs() as logs:
        sweeping = asyncio.create_task(sweeper.run(stop))
        try:

            async def told(times: int) -> bool:
                found = [e for e in logs if e["event"] == "redis.wrong_type"]
                return sweeping.done() or len(found) >= times

            h.clock.advance(PAUSE_OVER_MS)
            await until(lambda: told(1))
            h.clock.advance(PAUSE_OVER_MS)
            await until(lambda: told(2))
            assert not sweeping.done(), repr(sweeping.exception())
            first = next(e for e in logs if e["event"] == "redis.wrong_type")
            assert first["key"] == low and first["type"] == "string"
            await h.redis.delete(low)
            h.clock.advance(PAUSE_OVER_MS)

            async def published() -> bool:
                return row.id in await admin.instance_ids(h.redis, h.keys)

            await until(published)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(sweeping, return_exceptions=True), 20)


async def test_a_role_starts_past_a_key_of_another_type(outage: Harness) -> None:
    """At start the key is named and the role starts (it pauses that stream alone), where
    it used to end, and under `taskstream up` start again and end again without end."""
    h = outage
    await h.redis.set(h.keys.stream(Priority.LOW), "clobbered")
    s = Settings(namespace=h.keys.namespace, key_prefix=h.keys.prefix)
    cluster = Cluster(s, Endpoints("redis://unused", "sqlite://"), h.store, h.redis)
    with capture_logs() as logs:
        clock = await _dependencies_up(
            cluster, asyncio.Event(), "executor", redis_needs.executor_calls
        )
    assert clock is not None
    assert [e["key"] for e in logs if e["event"] == "redis.wrong_type"] == [
        h.keys.stream(Priority.LOW)
    ]
    assert await h.redis.xinfo_groups(h.keys.stream(Priority.HIGH))  # the others are made


async def _retrying(h: Harness, task_id: str, fire_ms: int) -> str:
    row = await h.trigger(TASKS, task_id, fire_ms=fire_ms)
    for src, dst in ((Status.DISPATCHED, Status.RUNNING), (Status.RUNNING, Status.RETRYING)):
        moved = await h.store.transition(row.id, src, dst, reason="setup", next_attempt_at_ms=1)
        assert moved.ok
    return row.id


async def test_a_scheduler_publishes_the_other_streams_past_a_key_of_another_type(
    outage: Harness,
) -> None:
    """A due retry of the key's priority used to end the scheduler (the publish of the due
    retries raised WRONGTYPE). It is left RETRYING and named; the others are published."""
    h = outage
    await h.apply(TASKS)
    low_id = await _retrying(h, "t-low", 1_000)
    default_id = await _retrying(h, "t-default", 2_000)
    low = h.keys.stream(Priority.LOW)
    await h.redis.set(low, "clobbered")
    with capture_logs() as logs:
        await h.scheduler().run_pass()
    assert await _is(h, default_id, Status.DISPATCHED)
    assert await _is(h, low_id, Status.RETRYING)
    told = [e for e in logs if e["event"] == "redis.wrong_type"]
    assert [(e["key"], e["type"], e["instance_id"]) for e in told] == [(low, "string", low_id)]
