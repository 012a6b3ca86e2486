"""What only the Redis backends promise: their keys, their expiry, and driver errors turned
into `GuardUnavailable`."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import cast

import pytest

from taskstream.core import streams
from taskstream.core.errors import QueueUnavailable
from taskstream.core.protocol import Keys
from taskstream.ratelimit.backend import GuardUnavailable
from taskstream.ratelimit.breaker import Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.rigs import RedisRig, open_rig

UNREACHABLE_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
async def rig(redis_url: str, namespace: str) -> AsyncIterator[RedisRig]:
    async with open_rig("redis", redis_url, namespace) as opened:
        assert isinstance(opened, RedisRig)
        yield opened


async def test_hits_are_unique_members_of_the_limiter_key(rig: RedisRig) -> None:
    tokens = (f"tok{n}" for n in itertools.count())
    limiter = RedisLimiter(rig.redis, rig.keys, token=lambda: next(tokens))
    for _ in range(3):
        await limiter.acquire("api", 10, 5_000)
    key = rig.keys.limiter("api")
    raw = await rig.redis.zrange(key, 0, -1, withscores=True)
    members = cast(list[tuple[bytes, float]], raw)
    assert [m.decode().split(":")[1] for m, _ in members] == ["tok0", "tok1", "tok2"]
    assert all(m.decode().split(":")[0] == str(int(score)) for m, score in members)
    assert 0 < await rig.redis.pttl(key) <= 10_000


async def test_breaker_state_lives_in_one_hash(rig: RedisRig) -> None:
    breakers = RedisBreakers(rig.redis, rig.keys)
    await breakers.record("api", Outcome.FAILURE, BreakerConfig(), probe_round=None)
    stored = await rig.redis.hgetall(rig.keys.breaker("api"))
    assert stored[b"status"] == b"closed"
    assert stored[b"consecutive_failures"] == b"1"
    assert await rig.redis.pttl(rig.keys.breaker("api")) == -1


async def test_an_unreachable_redis_is_a_guard_error() -> None:
    client = streams.connect(UNREACHABLE_URL)
    keys = Keys(prefix="tstest", namespace="unreachable")
    limiter, breakers, cfg = (
        RedisLimiter(client, keys),
        RedisBreakers(client, keys),
        BreakerConfig(),
    )
    try:
        calls = [
            limiter.acquire("api", 1, 1_000),
            breakers.admit("api", cfg),
            breakers.record("api", Outcome.SUCCESS, cfg, probe_round=None),
            breakers.state("api"),
        ]
        for call in calls:
            with pytest.raises(GuardUnavailable) as raised:
                await call
            assert isinstance(raised.value, QueueUnavailable)
    finally:
        await client.aclose()
