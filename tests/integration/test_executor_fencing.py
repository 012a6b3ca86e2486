"""Work done once, on real Redis and a real store (in-process, clock passed in): a duplicate
delivery has one committed effect, a fenced zombie neither commits nor acks, a failed
attempt's effect is kept unless the agent forgets it, an effect under a long dedupe key
commits, and nothing is lost when Redis is emptied in flight."""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.agents.base import effect_key
from taskstream.core import streams
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.executor_cases import TASKS, harness, reach, run_until, status_of
from tests.integration.harness import T0, Harness, Running, until


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


@pytest.mark.parametrize(
    ("task", "performed_again"), [("effect-fails-first", False), ("effect-refused-first", True)]
)
async def test_a_failed_attempts_effect_is_kept_unless_the_agent_forgets_it(
    h: Harness, task: str, performed_again: bool
) -> None:
    """Attempt 1 gets the effect from `once`, then fails. Its key commits with the failure (the
    effect may have happened), so attempt 2 does not perform it again; unless attempt 1 said
    with `forget` that it did not happen, and then attempt 2 performs it."""
    row = await h.trigger(TASKS, task)
    await h.run_until(row.id, Status.RETRYING)
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send") is not performed_again
    h.clock.advance(1000)
    await h.scheduler().run_pass()
    await h.run_until(row.id, Status.SUCCESS)
    done = await h.store.get_instance(row.id)
    assert done is not None and done.result == {"performed": performed_again, "attempt": 2}
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send")


async def test_a_duplicate_delivery_has_one_committed_effect(h: Harness) -> None:
    row = await h.trigger(TASKS, "effect")
    stream = h.keys.stream(Priority.DEFAULT)
    entries: Any = await h.redis.xrange(stream)
    [(entry_id, fields)] = entries
    await h.redis.xadd(stream, fields)  # the same entry, twice on the stream
    ex1 = Running(h.executor("c1"))
    ex2 = Running(h.executor("c2"))
    try:
        await reach(h, row.id, Status.SUCCESS)
        await h.sweeper(min_idle_ms=0).sweep_once()  # acks a copy another consumer left

        async def drained() -> bool:
            return await h.redis.xlen(stream) == 0

        await until(drained)
    finally:
        await ex1.close()
        await ex2.close()
    history = await h.store.history(row.id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert await h.store.side_effect_done(f"{row.dedupe_key}:send")
    assert (await h.redis.xpending(stream, GROUP))["pending"] == 0
    assert entry_id


async def test_a_fenced_zombie_does_not_commit_or_ack(h: Harness) -> None:
    """Run A is timed out by the sweeper (owner gone), B re-runs and commits; A's late
    commit is fenced and its entry stays unacked by A."""
    row = await h.trigger(TASKS, "effect")
    stream = h.keys.stream(Priority.DEFAULT)
    [d] = await streams.read(h.redis, h.keys, "zombie", count=1, block_ms=10)
    from taskstream.core.store.port import ClaimRequest, FinishRequest

    won = await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner="zombie")
    token = won[row.id].token
    counts = await h.sweeper().sweep_once()  # "zombie" has no liveness key: owner lost
    assert counts.get("timeout") == 1
    assert await status_of(h, row.id) is Status.RETRYING
    h.clock.advance(60_000)
    await h.scheduler().run_pass()
    await run_until(h, h.executor("c2"), [row.id], Status.SUCCESS)
    late = await h.store.finish_many([FinishRequest(row.id, token, Status.SUCCESS, "late")])
    assert not late[row.id].ok
    history = await h.store.history(row.id)
    assert [x.to_status for x in history].count(Status.SUCCESS) == 1
    assert [x.owner for x in history if x.to_status is Status.SUCCESS] == ["c2"]
    assert d.stream == stream


async def test_redis_emptied_in_flight_nothing_is_lost(h: Harness) -> None:
    rows = [await h.trigger(TASKS, "slow", T0 + i) for i in range(6)]
    await h.redis.delete(*h.keys.streams())  # what FLUSHDB does to our keys
    h.clock.advance(60_000)  # past the reconciler's grace
    counts = await h.sweeper().sweep_once()
    assert counts["republished"] == 6
    await run_until(h, h.executor(concurrency=8), [row.id for row in rows], Status.SUCCESS)


LONG_KEY = f"""
tasks:
  - id: long-key
    agent: effect
    dedupe_key: "{{task_id}}:{{scheduled_for}}:{"k" * 220}"
    payload: {{seconds: 0}}
"""


async def test_a_side_effect_of_an_instance_with_a_long_dedupe_key_commits(h: Harness) -> None:
    """`dedupe_key:name` would be longer than the store's key column: the key is stored as
    its digest instead of failing the commit every time."""
    await h.apply(LONG_KEY)
    row = await h.trigger(LONG_KEY, "long-key")
    assert len(f"{row.dedupe_key}:send") > 255
    await run_until(h, h.executor(), [row.id], Status.SUCCESS)
    assert await h.store.side_effect_done(effect_key(row.dedupe_key, "send"))
    done = await h.store.get_instance(row.id)
    assert done is not None and done.result == {"performed": True, "attempt": 1}
