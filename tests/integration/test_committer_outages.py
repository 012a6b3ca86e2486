"""The committer across failures around its commit, on real Redis and a real store: a run
whose follow-up move or ack failed is left to the sweeper without holding back the commits
and acks of the runs batched with it."""

from __future__ import annotations

import asyncio
from random import Random
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.errors import StoreError, StoreUnavailable
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult
from taskstream.core.store.records import FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.executor.committer import Committer
from taskstream.executor.outcome import RunEnd, succeeded
from taskstream.executor.retry import Failure
from tests.integration import outages
from tests.integration.harness import T0, Harness
from tests.integration.outages import no_dead_letters


class _SecondMoveFails(SqlStore):
    """The real store, except that moving `refused` on from TIMEOUT fails as if the link
    dropped before the statement reached the server."""

    refused = ""

    async def transition(self, instance_id: str, src: Status, dst: Status, **kw: Any) -> CasResult:
        if instance_id == self.refused and src is Status.TIMEOUT:
            raise StoreUnavailable("store: connection lost")
        return await super().transition(instance_id, src, dst, **kw)


class _RefusesBatches(SqlStore):
    """The real store, except that it refuses any finish of more than one run, as it would a
    batch holding a value it will not take."""

    async def finish_many(self, requests: list[FinishRequest]) -> dict[str, CasResult]:
        if len(requests) > 1:
            raise StoreError("store: value refused")
        return await super().finish_many(requests)


URGENT = """
tasks:
  - id: urgent
    agent: slow
    priority: high
    retry: {max_attempts: 1}
    payload: {seconds: 0}
"""


async def test_a_failed_ack_in_a_refused_batch_does_not_keep_the_rest_from_their_commit(
    db_url: str, redis: streams.Redis, keys: Keys
) -> None:
    """A refused batch is committed run by run. The first run's ack then fails (its stream
    is no longer a stream); the run after it is still committed and acked, and the first,
    committed, is left to the sweeper's ack."""
    store = await _RefusesBatches.connect(db_url)
    try:
        h = await outages.harness(store, redis, keys)
        await h.apply(URGENT)
        first = await h.trigger(URGENT, "urgent")
        second = await h.trigger(outages.TASKS, "quick", fire_ms=T0 + 1000)
        deliveries = await streams.read(h.redis, h.keys, "c1", count=2, block_ms=10)
        runs = {
            r.entry.instance_id: r for r in await (await outages.intake(h, "c1")).admit(deliveries)
        }
        committer = Committer(store, h.redis, h.keys, h.clock, Random(7), dead=no_dead_letters)
        unacked = committer.enqueue(runs[first.id], succeeded({}))
        committed = committer.enqueue(runs[second.id], succeeded({}))
        await h.redis.delete(h.keys.stream(Priority.HIGH))
        await h.redis.set(h.keys.stream(Priority.HIGH), "not a stream")
        await _commit_queued(committer)

        with pytest.raises(Exception, match="WRONGTYPE"):
            unacked.result()
        assert committed.result() is True
        assert (await _status(store, first.id)) == (Status.SUCCESS, None)
        assert (await _status(store, second.id)) == (Status.SUCCESS, None)
        pending = await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP)
        assert pending["pending"] == 0
    finally:
        await store.close()


async def test_a_failed_move_out_of_timeout_does_not_hold_back_the_acks_of_its_batch(
    db_url: str, redis: streams.Redis, keys: Keys
) -> None:
    """A timed-out run and a successful one are committed in one batch; the timed-out run's
    move TIMEOUT -> FAILED then fails. The successful run is acked and reported committed;
    the timed-out one stays pending (its row TIMEOUT) and the sweeper finishes it."""
    store = await _SecondMoveFails.connect(db_url)
    try:
        h = await outages.harness(store, redis, keys)
        late = await h.trigger(outages.TASKS, "quick", fire_ms=T0)
        done = await h.trigger(outages.TASKS, "quick", fire_ms=T0 + 1000)
        store.refused = late.id
        deliveries = await streams.read(h.redis, h.keys, "c1", count=2, block_ms=10)
        runs = {
            r.entry.instance_id: r for r in await (await outages.intake(h, "c1")).admit(deliveries)
        }
        committer = Committer(store, h.redis, h.keys, h.clock, Random(7), dead=no_dead_letters)
        timed_out = committer.enqueue(runs[late.id], RunEnd("timeout", failure=Failure.TIMEOUT))
        committed = committer.enqueue(runs[done.id], succeeded({}))
        await _commit_queued(committer)  # one batch, then the queue is empty

        assert committed.result() is True
        with pytest.raises(StoreUnavailable):
            timed_out.result()
        pending = await h.redis.xpending_range(
            h.keys.stream(Priority.DEFAULT), GROUP, min="-", max="+", count=10
        )
        assert [p["message_id"] for p in pending] == [runs[late.id].delivery.entry_id.encode()]
        assert (await _status(store, late.id)) == (Status.TIMEOUT, None)

        store.refused = ""
        await _sweep_past_leases(h)
        assert (await _status(store, late.id)) == (Status.FAILED, FailClass.EXHAUSTED)
        assert (await _status(store, done.id)) == (Status.SUCCESS, None)
    finally:
        await store.close()


STRICT = """
tasks:
  - id: strict
    agent: slow
    retry: {max_attempts: 5, retry_on: [retriable]}
    payload: {seconds: 0}
"""


async def test_a_timeout_left_behind_is_finished_under_the_tasks_retry_on(
    db_url: str, redis: streams.Redis, keys: Keys
) -> None:
    """The run hit its own timeout and its task does not retry timeouts: the executor plans
    TIMEOUT -> FAILED (fatal), and that second move fails. The sweeper finishes the row the
    same way, not with a retry the task's policy forbids."""
    store = await _SecondMoveFails.connect(db_url)
    try:
        h = await outages.harness(store, redis, keys)
        await h.apply(STRICT)
        row = await h.trigger(STRICT, "strict")
        store.refused = row.id
        deliveries = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
        [run] = await (await outages.intake(h, "c1")).admit(deliveries)
        committer = Committer(store, h.redis, h.keys, h.clock, Random(7), dead=no_dead_letters)
        timed_out = committer.enqueue(run, RunEnd("timeout", failure=Failure.TIMEOUT))
        await _commit_queued(committer)
        with pytest.raises(StoreUnavailable):
            timed_out.result()
        assert (await _status(store, row.id)) == (Status.TIMEOUT, None)

        store.refused = ""
        await _sweep_past_leases(h)
        assert (await _status(store, row.id)) == (Status.FAILED, FailClass.FATAL)
    finally:
        await store.close()


async def _commit_queued(committer: Committer) -> None:
    """Run the committer over what is queued, then let it end."""
    stop = asyncio.Event()
    stop.set()
    await committer.run(stop)


async def _sweep_past_leases(h: Harness) -> None:
    """Two sweeps, each a minute on: past a 30 s lease, then past the sweeper's idle time."""
    sweeper = h.sweeper()
    for _ in range(2):
        h.clock.advance(60_000)
        await sweeper.sweep_once()


async def _status(store: SqlStore, instance_id: str) -> tuple[Status, FailClass | None]:
    row = await store.get_instance(instance_id)
    assert row is not None
    return row.status, row.fail_class
