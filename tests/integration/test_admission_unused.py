"""Window slots of admissions whose calls are known never to go out are given back (real
Redis, a real store). A slot kept for a call never sent counts until it leaves the window
(and, for the long cap, twice that): the upstream then gets fewer calls than its limit.

Known unused: a run's own admission that went stale before its first call (the call takes
a new slot); a call whose admission went stale before its request was sent (it is not sent).
A run whose agent ran keeps its own admissions: an agent with HTTP code of its own may have
made the call they stand for.
"""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.breaker import Outcome
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.virtual_time import virtual

Gated = tuple[UpstreamGate, FixedClock]


@pytest.fixture
async def gate(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> tuple[UpstreamGate, FixedClock]:
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
