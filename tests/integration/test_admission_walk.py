"""The admission walk (`tests.integration.admission_walk`): 3 seeds of 300 steps on every
dialect (under 0.5 s each), 20 seeds of 1,000 under the `fault` marker."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.admission_walk import walk


@pytest.mark.parametrize("seed", range(3))
async def test_a_random_walk_leaks_no_slot_and_no_probe(
    store: SqlStore, redis: streams.Redis, keys: Keys, redis_url: str, seed: int
) -> None:
    await walk(store, redis, keys, redis_url, seed, steps=300)


@pytest.mark.fault
@pytest.mark.parametrize("seed", range(100, 120))
async def test_a_long_random_walk_leaks_no_slot_and_no_probe(
    store: SqlStore, redis: streams.Redis, keys: Keys, redis_url: str, seed: int
) -> None:
    await walk(store, redis, keys, redis_url, seed, steps=1_000)
