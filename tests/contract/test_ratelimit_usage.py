"""`Limiter.usage` and `Breakers.states`, the read-only views behind `taskstream status`, run
over the in-memory twin and Redis; plus what only Redis promises (the count is taken on the
server's clock, at the same edges as `window`, and the read writes nothing).

Windows are long (60 s) or short (200 ms) with the backend's clock moved by
`Rig.wait_until_ms`, never by a sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from random import Random

import pytest

from taskstream.core.errors import ConfigError
from taskstream.ratelimit import window
from taskstream.ratelimit.backend import Usage
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisLimiter
from tests.ratelimit.rigs import KINDS, RedisRig, Rig, open_rig

MINUTE_MS = 60_000
SHORT_MS = 200
CASES = 100
SPAN_MS = 10_000
EDGE_MARGIN_MS = 1_000


@pytest.fixture(params=KINDS)
async def rig(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    async with open_rig(request.param, redis_url, namespace) as opened:
        yield opened


@pytest.fixture
async def redis_rig(redis_url: str, namespace: str) -> AsyncIterator[RedisRig]:
    async with open_rig("redis", redis_url, namespace) as opened:
        assert isinstance(opened, RedisRig)
        yield opened


async def _acquire(rig: Rig, n: int, limit: int, window_ms: int, name: str = "api") -> None:
    for _ in range(n):
        await rig.limiter.acquire(name, limit, window_ms)


async def test_a_limiter_never_used_reads_empty_at_the_backend_clock(rig: Rig) -> None:
    before = await rig.now_ms()
    got = await rig.limiter.usage("api", MINUTE_MS)
    after = await rig.now_ms()
    assert (got.used, got.in_horizon) == (0, 0)
    assert before <= got.at_ms <= after


async def test_usage_counts_admitted_calls_only(rig: Rig) -> None:
    await _acquire(rig, 5, limit=3, window_ms=MINUTE_MS)
    got = await rig.limiter.usage("api", MINUTE_MS)
    assert (got.used, got.in_horizon) == (3, 3)


async def test_reading_usage_records_nothing(rig: Rig) -> None:
    for _ in range(10):
        assert (await rig.limiter.usage("api", MINUTE_MS)).used == 0
    admitted = await rig.limiter.acquire("api", 2, MINUTE_MS)
    assert (admitted.allowed, admitted.in_window) == (True, 1)
    assert (await rig.limiter.usage("api", MINUTE_MS)).used == 1
    assert (await rig.limiter.acquire("api", 2, MINUTE_MS)).allowed


async def test_usage_agrees_with_the_last_admission(rig: Rig) -> None:
    last = None
    for _ in range(4):
        last = await rig.limiter.acquire("api", 10, MINUTE_MS)
    assert last is not None
    assert (await rig.limiter.usage("api", MINUTE_MS)).used == last.in_window == 4


async def test_names_are_counted_separately(rig: Rig) -> None:
    await _acquire(rig, 2, limit=5, window_ms=MINUTE_MS, name="a")
    await _acquire(rig, 1, limit=5, window_ms=MINUTE_MS, name="b")
    assert (await rig.limiter.usage("a", MINUTE_MS)).used == 2
    assert (await rig.limiter.usage("b", MINUTE_MS)).used == 1
    assert (await rig.limiter.usage("c", MINUTE_MS)).used == 0


async def test_hits_leave_the_window_then_the_horizon(rig: Rig) -> None:
    first_at = await rig.now_ms()
    await _acquire(rig, 2, limit=5, window_ms=SHORT_MS)
    last_at = await rig.now_ms()
    await rig.wait_until_ms(last_at + SHORT_MS)
    later = await rig.limiter.usage("api", SHORT_MS)
    assert later.used == 0
    if later.at_ms < first_at + 2 * SHORT_MS:  # always on the memory clock
        assert later.in_horizon == 2
    await rig.wait_until_ms(last_at + 2 * SHORT_MS)
    gone = await rig.limiter.usage("api", SHORT_MS)
    assert (gone.used, gone.in_horizon) == (0, 0)


@pytest.mark.parametrize("window_ms", [0, -5])
async def test_a_window_out_of_range_is_a_config_error(rig: Rig, window_ms: int) -> None:
    with pytest.raises(ConfigError):
        await rig.limiter.usage("api", window_ms)


async def test_breaker_states_are_read_together(rig: Rig) -> None:
    cfg = BreakerConfig(failure_threshold=2, cooldown_ms=MINUTE_MS)
    for _ in range(2):
        await rig.breakers.record("down", Outcome.FAILURE, cfg, probe_round=None)
    await rig.breakers.record("flaky", Outcome.FAILURE, cfg, probe_round=None)
    before = await rig.now_ms()
    got = await rig.breakers.states(["down", "flaky", "unused"])
    after = await rig.now_ms()
    assert before <= got.at_ms <= after
    assert got.states["down"] == await rig.breakers.state("down")
    assert got.states["down"].status is BreakerStatus.OPEN
    assert got.states["flaky"].consecutive_failures == 1
    assert got.states["unused"] == BreakerState()
    assert (await rig.breakers.states([])).states == {}


# --- Redis only ----------------------------------------------------------------------------


def _hit_offset(rng: Random) -> int:
    """How long ago a hit was, never within `EDGE_MARGIN_MS` of a window edge."""
    edges = (0, SPAN_MS, 2 * SPAN_MS)
    while True:
        offset = rng.randrange(0, 2 * SPAN_MS + 2_000)
        if all(abs(offset - edge) > EDGE_MARGIN_MS for edge in edges):
            return offset


async def test_the_usage_script_counts_like_the_pure_window(redis_rig: RedisRig) -> None:
    rng = Random(5)
    limiter = RedisLimiter(redis_rig.redis, redis_rig.keys)
    for case in range(CASES):
        name = f"case{case}"
        now = await redis_rig.now_ms()
        hits = [now - _hit_offset(rng) for _ in range(rng.randint(0, 14))]
        if hits:
            members = {f"{t}:seed{i}": t for i, t in enumerate(hits)}
            await redis_rig.redis.zadd(redis_rig.keys.limiter(name), members)
        got = await limiter.usage(name, SPAN_MS)
        want = Usage(
            used=sum(t > got.at_ms - SPAN_MS for t in hits),
            in_horizon=sum(t > got.at_ms - window.horizon_ms(SPAN_MS) for t in hits),
            at_ms=got.at_ms,
        )
        assert got == want, (case, sorted(got.at_ms - t for t in hits))


async def test_the_usage_script_writes_nothing(redis_rig: RedisRig) -> None:
    key = redis_rig.keys.limiter("api")
    await redis_rig.limiter.usage("api", MINUTE_MS)
    assert await redis_rig.redis.exists(key) == 0
    await redis_rig.limiter.acquire("api", 5, MINUTE_MS)
    await redis_rig.redis.persist(key)
    members = await redis_rig.redis.zrange(key, 0, -1, withscores=True)
    await redis_rig.limiter.usage("api", MINUTE_MS)
    assert await redis_rig.redis.zrange(key, 0, -1, withscores=True) == members
    assert await redis_rig.redis.pttl(key) == -1
