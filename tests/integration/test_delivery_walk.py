"""The delivery walk (`tests.integration.delivery_walk`) over a few fixed seeds, on every
dialect; a longer run of more seeds is under the `fault` marker."""

from __future__ import annotations

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.delivery_walk import walk
from tests.integration.harness import Harness


async def _harness(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    h = Harness(store, redis, keys)
    h.clock.set(await store.db_now_ms())
    return h


@pytest.mark.parametrize("seed", range(4))
async def test_a_random_walk_keeps_the_delivery_guarantees(
    store: SqlStore, redis: streams.Redis, keys: Keys, seed: int
) -> None:
    """Attempts counted within max_attempts, one SUCCESS at most, legal chained moves, settled rows
    unchanged, after each of 25 random steps; every instance settled at the end."""
    await walk(await _harness(store, redis, keys), seed, steps=25)


@pytest.mark.fault
@pytest.mark.parametrize("seed", range(100, 120))
async def test_a_long_random_walk_keeps_the_delivery_guarantees(
    store: SqlStore, redis: streams.Redis, keys: Keys, seed: int
) -> None:
    """As above, over 20 more seeds of 40 steps each (about 3 s a walk)."""
    await walk(await _harness(store, redis, keys), seed, steps=40)
