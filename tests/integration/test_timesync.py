"""Keeping a process's clock on the database's: a stop ends the resync loop without one more
read of the database clock (a database that stopped answering would hold the exit up)."""

from __future__ import annotations

import asyncio

from taskstream.core.store.sql import SqlStore
from taskstream.core.timesync import keep_synced, synced_clock


class _Counting(SqlStore):
    """The real store, counting its reads of the database clock."""

    reads = 0

    async def db_now_ms(self) -> int:
        self.reads += 1
        return await super().db_now_ms()


async def test_a_stop_ends_the_resync_without_reading_the_database_clock(db_url: str) -> None:
    store = await _Counting.connect(db_url)
    try:
        clock = await synced_clock(store)
        stop = asyncio.Event()
        syncing = asyncio.create_task(keep_synced(store, clock, stop))
        await asyncio.sleep(0)  # the loop is now waiting for its next resync
        store.reads = 0
        stop.set()
        await asyncio.wait_for(syncing, timeout=5)
        assert store.reads == 0
    finally:
        await store.close()
