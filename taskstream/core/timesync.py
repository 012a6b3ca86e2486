"""Keeping a process clock aligned with the database clock, the one clock every host shares.

Retry due times, deadlines and lease checks compare instants written by different hosts; an
`OffsetClock` synced here makes a host whose own clock is minutes off agree with the rest.
"""

from __future__ import annotations

import asyncio
import contextlib

from taskstream.core.clock import OffsetClock, SystemClock
from taskstream.core.errors import StoreUnavailable
from taskstream.core.store.port import Store

RESYNC_S = 60.0


async def sync(store: Store, clock: OffsetClock) -> None:
    """Measure the offset once (host readings bracket the database read)."""
    host = SystemClock()
    before = host.now_ms()
    db_now = await store.db_now_ms()
    clock.sync(db_now, before, host.now_ms())


async def synced_clock(store: Store) -> OffsetClock:
    clock = OffsetClock()
    await sync(store, clock)
    return clock


async def keep_synced(store: Store, clock: OffsetClock, stop: asyncio.Event) -> None:
    """Resync every `RESYNC_S` seconds until `stop`; a store outage keeps the last offset."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=RESYNC_S)
        if stop.is_set():
            return  # a stopping process needs no offset, nor a wait on a store that is away
        with contextlib.suppress(StoreUnavailable):
            await sync(store, clock)
