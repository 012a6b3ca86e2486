"""A run cancelled (a stop past its grace, a fence) while it is being admitted to its
upstreams gives back what the admission took so far: no call goes out, and a half-open
probe kept would refuse every run on every executor until `probe_timeout` passed, a window
slot kept would count for a call never sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.rigs import RedisRig

CFG = BreakerConfig(failure_threshold=1, cooldown_ms=20, probes=1, probe_timeout_ms=600_000)


class _HeldLimiter(RedisLimiter):
    """The real limiter, whose `acquire` for `held` waits until released (a Redis that
    answers slowly); `entered` is set when it starts waiting."""

    held = "llm"

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.entered = asyncio.Event()
        self.release_ = asyncio.Event()

    async def acquire(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == self.held:
            self.entered.set()
            await self.release_.wait()
        return await super().acquire(name, *args, **kwargs)


@pytest.fixture
async def setup(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> tuple[UpstreamGate, _HeldLimiter, RedisBreakers]:
    limited = {"limit": 100, "window": 60.0, "burst": None}
    await store.upsert_upstreams({"llm": limited, "api": limited})
    limiter, breakers = _HeldLimiter(redis, keys), RedisBreakers(redis, keys)
    return UpstreamGate(store, limiter, breakers, CFG), limiter, breakers


async def _cancelled_midway(gate: UpstreamGate, limiter: _HeldLimiter, *names: str) -> None:
    admitting = asyncio.create_task(gate.admit_run(list(names)))
    await asyncio.wait_for(limiter.entered.wait(), timeout=10)
    admitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitting


async def test_a_run_cancelled_while_admitted_gives_back_its_probe(
    setup: tuple[UpstreamGate, _HeldLimiter, RedisBreakers], redis: streams.Redis, keys: Keys
) -> None:
    gate, limiter, breakers = setup
    assert await gate.record_call("llm", Outcome.FAILURE, probe_round=None) is not None
    await RedisRig(redis, keys).wait_until_ms((await breakers.state("llm")).since_ms + 20)
    await _cancelled_midway(gate, limiter, "llm")  # the probe is taken, the window asked
    state = await breakers.state("llm")
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)
    decision = await breakers.admit("llm", CFG)
    assert decision.allowed, f"probe kept: runs refused for {decision.retry_after_ms} ms"


async def test_a_run_cancelled_while_admitted_gives_back_its_window_slots(
    setup: tuple[UpstreamGate, _HeldLimiter, RedisBreakers], redis: streams.Redis, keys: Keys
) -> None:
    gate, limiter, _ = setup
    await _cancelled_midway(gate, limiter, "api", "llm")  # `api` admitted, `llm` asked
    assert await redis.zcard(keys.limiter("api")) == 0
