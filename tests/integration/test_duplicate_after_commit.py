"""A duplicate delivery read while its run commits, on real Redis and a real store: the
intake's read of the row sees it RUNNING under this process, but by the time it looks for a
run of its own holding that claim, the run has committed and ended. The claim is not adopted
(that would run the agent a second time); the duplicate is left for the sweeper to ack."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from random import Random

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.executor.committer import Committer
from taskstream.executor.heartbeat import Heartbeat
from taskstream.executor.intake import Intake
from taskstream.executor.outcome import succeeded
from tests.integration import outages
from tests.integration.outages import forever, no_dead_letters


class _CommitsAfterRead(SqlStore):
    """The real store, except that the next read of `instance_id` is followed, before its
    answer is returned, by `then()`: another task's writes land between the two."""

    instance_id = ""
    then: Callable[[], Awaitable[None]] | None = None

    async def get_instance(self, instance_id: str) -> InstanceRow | None:
        row = await super().get_instance(instance_id)
        if instance_id == self.instance_id and self.then is not None:
            then, self.then = self.then, None
            await then()
        return row


async def test_a_duplicate_read_while_its_run_commits_is_not_adopted(
    db_url: str, redis: streams.Redis, keys: Keys
) -> None:
    store = await _CommitsAfterRead.connect(db_url)
    try:
        h = await outages.harness(store, redis, keys)
        row = await h.trigger(outages.TASKS, "quick")
        heartbeat = Heartbeat(store, h.redis, h.keys, "c1", h.clock, liveness_ttl_s=6)
        registry = default_registry(h.registry_modules)
        defs = DefinitionCache(store)
        await defs.refresh()
        intake = Intake(store, h.redis, h.keys, registry, defs, "c1", held=heartbeat.ran)
        [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
        [run] = await intake.admit([delivery])
        task = asyncio.create_task(forever())
        heartbeat.track(run, task)
        stream = h.keys.stream(Priority.DEFAULT)
        await h.redis.xadd(stream, delivery.fields)  # type: ignore[arg-type]
        [duplicate] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)

        async def commit() -> None:
            committer = Committer(store, h.redis, h.keys, h.clock, Random(7), no_dead_letters)
            done = committer.enqueue(run, succeeded({}))
            stop = asyncio.Event()
            stop.set()
            await committer.run(stop)
            assert done.result() is True
            heartbeat.untrack(run)

        store.instance_id, store.then = row.id, commit
        assert await intake.admit([duplicate]) == []
        task.cancel()

        assert store.then is None  # the commit did land between the read and the check
        history = await store.history(row.id)
        assert [h.to_status for h in history if h.from_status is Status.RUNNING] == [Status.SUCCESS]
        pending = await h.redis.xpending_range(stream, GROUP, min="-", max="+", count=10)
        assert [p["message_id"] for p in pending] == [duplicate.entry_id.encode()]
        h.clock.advance(60_000)
        await h.sweeper().sweep_once()
        assert (await h.redis.xpending(stream, GROUP))["pending"] == 0
    finally:
        await store.close()
