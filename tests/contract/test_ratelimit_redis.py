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
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome
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


UNREADABLE_HASHES = [
    ({"status": "bogus", "consecutive_failures": "4"}, BreakerState()),
    ({"status": "closed", "consecutive_failures": "x"}, BreakerState()),
    ({"status": "open", "since_ms": "1e3"}, BreakerState(status=BreakerStatus.OPEN)),
    (
        {"status": "half_open", "probes_admitted": "-1", "probe_successes": "0x0"},
        BreakerState(status=BreakerStatus.HALF_OPEN),
    ),
    (
        {"status": "closed", "window_start_ms": "9" * 30, "window_calls": "2"},
        BreakerState(window_calls=2),
    ),
    ({"status": b"\xff", "window_failures": b"3"}, BreakerState()),
]


@pytest.mark.parametrize(("written", "read_as"), UNREADABLE_HASHES)
async def test_a_breaker_field_that_cannot_be_read_is_taken_as_fresh(
    rig: RedisRig, written: dict[str, str | bytes], read_as: BreakerState
) -> None:
    """A hash written by some other program (redis-cli, an older version) with a value no
    breaker writes is read as if that field were absent (the whole hash, for its status), by
    the scripts and by reads alike, instead of failing every admission, every scheduler pass
    and `taskstream status`; the next write of the state replaces it."""
    breakers, cfg = RedisBreakers(rig.redis, rig.keys), BreakerConfig()
    key = rig.keys.breaker("api")
    await rig.redis.hset(key, mapping=written)  # type: ignore[arg-type]
    assert (await breakers.states(["api"])).states["api"] == read_as
    assert await breakers.state("api") == read_as
    await breakers.admit("api", cfg)
    update = await breakers.record("api", Outcome.FAILURE, cfg, probe_round=None)
    assert update.state == await breakers.state("api")
    stored = await rig.redis.hgetall(key)
    assert all(v.isdigit() for k, v in stored.items() if k != b"status")
    assert stored[b"status"] in (b"closed", b"open", b"half_open")
