"""The guard walk (`tests.ratelimit.guard_walk`): several executors' limiters and breakers on
the same Redis keys, on a clock the walk moves, checked after every random step: 6 seeds of
300 steps here (about 0.5 s each), 40 seeds of 1,500 under the `fault` marker (about 1 min in
all)."""

from __future__ import annotations

import pytest

from taskstream.core.protocol import Keys
from tests.ratelimit.guard_walk import walk


@pytest.mark.parametrize("seed", range(6))
async def test_a_random_walk_keeps_the_limits_and_the_breaker_rules(
    redis_url: str, namespace: str, seed: int
) -> None:
    await walk(redis_url, Keys(prefix="tstest", namespace=namespace), seed, steps=300)


@pytest.mark.fault
@pytest.mark.parametrize("seed", range(100, 140))
async def test_a_long_random_walk_keeps_the_limits_and_the_breaker_rules(
    redis_url: str, namespace: str, seed: int
) -> None:
    await walk(redis_url, Keys(prefix="tstest", namespace=namespace), seed, steps=1_500)
