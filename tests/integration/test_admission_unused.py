"""Window slots of admissions whose calls are known never to go out are given back (real
Redis, a real store). A slot kept for a call never sent counts until it leaves the window
(and, for the long cap, twice that): the upstream then gets fewer calls than its limit.

Known unused: the run's deadline passed while it was admitted (its agent is never called);
a run's own admission that went stale before its first call (the call takes a new slot); a
call whose admission went stale before its request was sent (it is not sent). A run whose
agent ran keeps its own admissions: an agent with HTTP code of its own may have made the
call they stand for.
"""

from __future__ import annotations

from typing import Any

import pytest

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import Outcome
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.integration.harness import Harness, Running, until
from tests.ratelimit.virtual_time import virtual

LATE = """
upstreams:
  llm: {limit: 5, window: 60s}
tasks:
  - {id: late, agent: echo, upstreams: [llm], deadline: 5s, retry: {max_attempts: 1}}
  - {id: ask, agent: echo, upstreams: [llm], retry: {max_attempts: 1}}
"""


class _SlowLimiter(RedisLimiter):
    """The real limiter, whose answer takes `seconds` on `clock` (a Redis that is slow)."""

    def __init__(self, redis: streams.Redis, keys: Keys, clock: FixedClock, seconds: float):
        super().__init__(redis, keys)
        self._clock, self._ms = clock, round(seconds * 1000)

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(self._ms)
        return await super().acquire(*args, **kwargs)


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(LATE)
    return harness


async def test_a_run_whose_deadline_passed_while_admitted_gives_back_its_slot(
    h: Harness,
) -> None:
    """The admission answers after the deadline: the agent is not called, so the slot the
    run took must be free again, not count for a minute for a call never sent."""
    await h.store.upsert_upstreams({"llm": {"limit": 5, "window": 60.0, "burst": None}})
    gate = UpstreamGate(
        h.store, _SlowLimiter(h.redis, h.keys, h.clock, 2.0), RedisBreakers(h.redis, h.keys)
    )
    deps = ExecutorDeps(
        h.store, h.redis, h.keys, default_registry(("tests.agents",)), h.clock, gate=gate
    )
    row = await h.trigger(LATE, "late", h.clock.now_ms())
    h.clock.advance(4_000)
    ex = Running(Executor(deps, ExecutorConfig(consumer="g1", block_ms=20)))
    try:

        async def failed() -> bool:
            got = await h.store.get_instance(row.id)
            return got is not None and got.status is Status.FAILED

        await until(failed)
    finally:
        await ex.close()
    assert await h.redis.zcard(h.keys.limiter("llm")) == 0


Gated = tuple[UpstreamGate, FixedClock]


@pytest.fixture
async def gate(store: SqlStore, redis: streams.Redis, keys: Keys) -> Gated:
    """A gate over the Redis backends on a clock of the test's; `llm` takes 1 call per 10 s
    plus a burst of 1 (so 2 per 20 s: the long cap)."""
    await store.upsert_upstreams({"llm": {"limit": 1, "window": 10.0, "burst": 1}})
    clock = FixedClock(await store.db_now_ms())
    on_clock = virtual(redis, clock)
    return UpstreamGate(store, RedisLimiter(on_clock, keys), RedisBreakers(on_clock, keys)), clock


async def test_a_stale_run_admission_replaced_at_the_first_call_gives_back_its_slot(
    gate: Gated, redis: streams.Redis, keys: Keys
) -> None:
    """The agent works 12 s before its first call: the run's admission is stale and the call
    takes a new slot. The stale one was never sent; kept, it would fill the long cap (2 per
    20 s) with the new one and refuse the next call, which the burst allows."""
    upstreams, clock = gate
    run = await upstreams.admit_run(["llm"])
    assert isinstance(run, RunUpstreams)
    clock.advance(12_000)
    first = await run.acquire("llm")
    assert not isinstance(first, int) and await run.sending(first)
    assert await redis.zcard(keys.limiter("llm")) == 1
    second = await run.acquire("llm")
    assert not isinstance(second, int), f"refused for {second} ms"
    await run.settle(Outcome.SUCCESS)


async def test_a_call_whose_admission_went_stale_before_sending_gives_back_its_slot(
    gate: Gated, redis: streams.Redis, keys: Keys
) -> None:
    """The call's connection took 12 s to set up: its admission is stale, so it is not sent,
    and its slot must not count against the call admitted in its place."""
    upstreams, clock = gate
    run = upstreams.bind(())
    ticket = await run.acquire("llm")
    assert not isinstance(ticket, int)
    clock.advance(12_000)
    assert not await run.sending(ticket)
    assert await redis.zcard(keys.limiter("llm")) == 0
    again = await run.acquire("llm")
    assert not isinstance(again, int) and await run.sending(again)
    third = await run.acquire("llm")
    assert not isinstance(third, int), f"refused for {third} ms"
