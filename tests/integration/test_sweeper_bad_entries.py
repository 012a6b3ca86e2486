"""Entries the store cannot even look up, on PostgreSQL (its text refuses a NUL, which the
other dialects store): the sweeper and the executor dead-letter them as malformed, instead
of failing on the store's refusal (the sweeper's pass, and the executor's whole batch)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.protocol import GROUP, Keys, Priority, WorkEntry, encode
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.executor_cases import TASKS, harness, run_until
from tests.integration.harness import Harness
from tests.support.databases import available_kinds, temp_database


@pytest.fixture
async def pg(redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    if "postgres" not in available_kinds():
        pytest.skip("no PostgreSQL")
    async with temp_database("postgres") as url:
        store = await SqlStore.connect(url)
        try:
            yield await harness(store, redis, keys)
        finally:
            await store.close()


def nul_entry() -> dict[str, str]:
    """An entry of version 1 in every other way whose instance id holds a NUL."""
    entry = WorkEntry(
        instance_id="i_\x00",
        task_id="slow",
        agent="slow",
        attempt=0,
        scheduled_for_ms=1,
        emitted_at_ms=1,
    )
    return encode(entry)


async def test_the_sweeper_dead_letters_an_entry_whose_instance_id_holds_a_nul(
    pg: Harness,
) -> None:
    """Its consumer died: the pass moves it to the dead-letter stream as a bad field."""
    stream = pg.keys.stream(Priority.DEFAULT)
    await pg.redis.xadd(stream, nul_entry())  # type: ignore[arg-type]
    assert len(await streams.read(pg.redis, pg.keys, "gone", count=1, block_ms=10)) == 1

    counts = await pg.sweeper().sweep_once()

    assert counts.get("dead_letter") == 1
    dead: Any = await pg.redis.xrange(pg.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"bad_field"]
    assert (await pg.redis.xpending(stream, GROUP))["pending"] == 0


async def test_an_entry_whose_instance_id_holds_a_nul_does_not_stop_a_run_read_with_it(
    pg: Harness,
) -> None:
    """Read in one batch with a good entry: the good one runs, the other is dead-lettered."""
    await pg.redis.xadd(pg.keys.stream(Priority.DEFAULT), nul_entry())  # type: ignore[arg-type]
    row = await pg.trigger(TASKS, "slow")

    await run_until(pg, pg.executor(), [row.id], Status.SUCCESS)

    dead: Any = await pg.redis.xrange(pg.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"bad_field"]
