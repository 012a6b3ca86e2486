"""The Redis scripts agree with the pure rules of `window` and `breaker`.

Each case writes a random state into Redis with every time relative to the server's clock and
at least 1 s away from any threshold, runs one script, and compares the answer with the pure
function at the server time read just before. Times the script sets to "now" must fall between
the readings taken before and after; retry-afters may be shorter by the time the call took.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from random import Random

import pytest

from taskstream.ratelimit import breaker, window
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.ratelimit.rigs import RedisRig, open_rig

CASES = 150
SPAN_MS = 10_000
EDGE_MARGIN_MS = 1_000
TIME_FIELDS = ("since_ms", "window_start_ms", "last_probe_ms")


@pytest.fixture
async def rig(redis_url: str, namespace: str) -> AsyncIterator[RedisRig]:
    async with open_rig("redis", redis_url, namespace) as opened:
        assert isinstance(opened, RedisRig)
        yield opened


def _hit_offset(rng: Random, window_ms: int) -> int:
    """How long ago a hit was, never within `EDGE_MARGIN_MS` of a window edge."""
    edges = (0, window_ms, 2 * window_ms)
    while True:
        offset = rng.randrange(0, 2 * window_ms + 2_000)
        if all(abs(offset - edge) > EDGE_MARGIN_MS for edge in edges):
            return offset


@pytest.mark.parametrize("seed", range(3))
async def test_limiter_script_matches_the_pure_window(rig: RedisRig, seed: int) -> None:
    rng = Random(seed)
    limiter = RedisLimiter(rig.redis, rig.keys)
    for case in range(CASES):
        name = f"case{case}"
        limit, burst = rng.randint(1, 5), rng.randint(0, 3)
        now = await rig.now_ms()
        hits = [now - _hit_offset(rng, SPAN_MS) for _ in range(rng.randint(0, 14))]
        if hits:
            members = {f"{t}:seed{i}": t for i, t in enumerate(hits)}
            await rig.redis.zadd(rig.keys.limiter(name), members)
        before = await rig.now_ms()
        got = await limiter.acquire(name, limit, SPAN_MS, burst)
        took = await rig.now_ms() - before
        want = window.decide(before, hits, limit, SPAN_MS, burst)
        where = (seed, case, limit, burst, sorted(before - t for t in hits))
        assert (got.allowed, got.in_window) == (want.allowed, want.in_window), where
        assert want.retry_after_ms - took <= got.retry_after_ms <= want.retry_after_ms, where


def _random_config(rng: Random) -> BreakerConfig:
    return BreakerConfig(
        failure_threshold=rng.randint(1, 4),
        failure_rate=rng.choice((0.25, 0.5, 1.0)),
        window_ms=SPAN_MS,
        min_calls=rng.randint(1, 5),
        cooldown_ms=SPAN_MS,
        probes=rng.randint(1, 3),
        probe_timeout_ms=SPAN_MS,
    )


def _random_state(rng: Random, cfg: BreakerConfig, now_ms: int) -> BreakerState:
    calls = rng.randint(0, 6)
    return BreakerState(
        status=rng.choice(list(BreakerStatus)),
        since_ms=now_ms - rng.choice((2 * SPAN_MS, SPAN_MS // 2)),
        consecutive_failures=rng.randint(0, cfg.failure_threshold - 1),
        window_start_ms=now_ms - rng.choice((2 * SPAN_MS, SPAN_MS // 2)),
        window_calls=calls,
        window_failures=rng.randint(0, calls),
        probes_admitted=rng.randint(0, cfg.probes),
        probe_successes=rng.randint(0, cfg.probes - 1),
        last_probe_ms=rng.choice((0, now_ms - 2 * SPAN_MS, now_ms - SPAN_MS // 2)),
    )


def _same_state(got: BreakerState, want: BreakerState, before: int, after: int) -> bool:
    """Equal, except that a time the pure rules set to `before` may be any time until `after`."""
    seen = dataclasses.asdict(got)
    for name in TIME_FIELDS:
        if getattr(want, name) == before and before <= seen[name] <= after:
            seen[name] = before
    return seen == dataclasses.asdict(want)


async def _seed(rig: RedisRig, name: str, state: BreakerState) -> None:
    fields = {k: str(v) for k, v in dataclasses.asdict(state).items()}
    await rig.redis.hset(rig.keys.breaker(name), mapping=fields)  # type: ignore[arg-type]


async def _check_admit(
    rig: RedisRig, breakers: RedisBreakers, name: str, start: BreakerState, cfg: BreakerConfig
) -> tuple[BreakerState, int, int]:
    before = await rig.now_ms()
    got = await breakers.admit(name, cfg)
    after = await rig.now_ms()
    want, state = breaker.admit(start, before, cfg)
    where = (cfg, start, got, want)
    assert (got.allowed, got.probe, got.transition) == (want.allowed, want.probe, want.transition)
    assert got.status == want.status, where
    wait = want.retry_after_ms
    assert wait - (after - before) <= got.retry_after_ms <= wait, where
    return state, before, after


async def _check_record(
    rig: RedisRig, breakers: RedisBreakers, name: str, start: BreakerState, cfg: BreakerConfig
) -> tuple[BreakerState, int, int]:
    pick = Random(name)
    outcome = pick.choice(list(Outcome))
    probe_round = pick.choice((None, start.since_ms, start.since_ms, start.since_ms - 1))
    before = await rig.now_ms()
    got = await breakers.record(name, outcome, cfg, probe_round=probe_round)
    after = await rig.now_ms()
    state = breaker.record(start, outcome, before, cfg, probe_round=probe_round)
    assert got.transition == breaker.transition(start.status, state.status), (cfg, start, got)
    assert _same_state(got.state, state, before, after), (cfg, start, outcome, got)
    return state, before, after


@pytest.mark.parametrize("op", ["admit", "record"])
@pytest.mark.parametrize("seed", range(3))
async def test_breaker_scripts_match_the_pure_state_machine(
    rig: RedisRig, seed: int, op: str
) -> None:
    rng = Random(seed)
    breakers = RedisBreakers(rig.redis, rig.keys)
    check = _check_admit if op == "admit" else _check_record
    for case in range(CASES):
        name, cfg = f"{seed}:{case}", _random_config(rng)
        start = _random_state(rng, cfg, await rig.now_ms())
        await _seed(rig, name, start)
        want, before, after = await check(rig, breakers, name, start, cfg)
        stored = await breakers.state(name)
        assert _same_state(stored, want, before, after), (seed, case, cfg, start, stored)
