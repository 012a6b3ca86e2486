"""Keeping a process clock aligned with the database clock, the one clock every host shares.

Retry due times, deadlines and lease checks compare instants written by different hosts; an
`OffsetClock` synced here makes a host whose own clock is minutes off agree with the rest.
"""

from __future__ import annotations

import asyncio
import contextlib

from taskstream.core.clock import OffsetClock
from taskstream.core.errors import StoreUnavailable
from taskstream.core.futures import unless_stopped
from taskstream.core.store.port import Store

RESYNC_S = 60.0
"""Seconds between two syncs, for the drift of the host's monotonic clock."""
STEP_CHECK_S = 1.0
"""Seconds between two looks for a step of the host's wall clock."""
WALL_STEP_MS = 500
"""A wall-clock step (ms) that makes a sync at once: on the database's own host the database
clock stepped with it."""


SAMPLES = 3
"""Database clock reads per sync; the one with the shortest round trip sets the offset."""


async def sync(store: Store, clock: OffsetClock) -> None:
    """Measure the offset: of `SAMPLES` reads of the database clock, each bracketed by host
    readings around its statement alone, the one with the shortest round trip, whose error
    is at most half of it (a read the server held up says little of when it read its
    clock). Steps of the wall clock are measured from before the reads."""
    wall_at = clock.wall_baseline()
    samples = [await store.clock_sample(clock.host_ms) for _ in range(SAMPLES)]
    db_now, before, after = min(samples, key=lambda s: s[2] - s[1])
    clock.sync(db_now, before, after, wall_at=wall_at)


async def synced_clock(store: Store) -> OffsetClock:
    clock = OffsetClock()
    await sync(store, clock)
    return clock


async def keep_synced(store: Store, clock: OffsetClock, stop: asyncio.Event) -> None:
    """Resync every `RESYNC_S` seconds, and within `STEP_CHECK_S` of a step of the host's wall
    clock of at least `WALL_STEP_MS`, until `stop`; a store outage keeps the last offset (a
    step in it is measured at the next resync), and a store that does not answer does not
    hold the stop up (`unless_stopped`)."""
    since_sync_s = 0.0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=STEP_CHECK_S)
        if stop.is_set():
            return  # a stopping process needs no offset, nor a wait on a store that is away
        since_sync_s += STEP_CHECK_S
        if since_sync_s < RESYNC_S and clock.wall_step_ms() < WALL_STEP_MS:
            continue
        since_sync_s = 0.0
        try:
            await unless_stopped(sync(store, clock), stop)
        except StoreUnavailable:
            # The last offset stands until the next resync: a store that is down is not
            # asked again every second because the step is still unmeasured.
            clock.rebase_wall()
