"""Pre-publishing instances for the benchmarks, two ways through the same outbox.

- `outbox`: `taskstream.core.outbox.Outbox.emit` per instance with at most 32 emits in flight,
  as a scheduler with many due tasks would.
- `bulk`: every emit of a chunk of 2,000 at once, so the outbox's group commit writes them in
  batches of `outbox.MAX_BATCH` (one transaction creating the rows with their history, one
  pipeline of XADDs, one transaction of CAS updates PENDING -> DISPATCHED per batch).

Instances come from `scheduler.service.new_instance` (one fire time per instance, 1 ms apart),
so ids, dedupe keys, business dates and trace ids are what the scheduler would make.
`python -m bench.verify_publish` checks that both ways leave identical rows, history and entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import new_instance

Mode = Literal["outbox", "bulk"]
BULK_CHUNK = 2_000
OUTBOX_IN_FLIGHT = 32


def instances(spec: TaskSpec, n: int, first_fire_ms: int) -> list[NewInstance]:
    return [new_instance(spec, first_fire_ms + i) for i in range(n)]


async def publish(
    mode: Mode,
    store: SqlStore,
    redis: streams.Redis,
    keys: Keys,
    clock: Clock,
    news: Sequence[NewInstance],
) -> None:
    if mode == "outbox":
        await publish_outbox(store, redis, keys, clock, news)
    else:
        await publish_bulk(store, redis, keys, clock, news)


async def publish_outbox(
    store: SqlStore,
    redis: streams.Redis,
    keys: Keys,
    clock: Clock,
    news: Sequence[NewInstance],
) -> None:
    outbox = Outbox(store, redis, keys)
    gate = asyncio.Semaphore(OUTBOX_IN_FLIGHT)

    async def one(new: NewInstance) -> None:
        async with gate:
            await outbox.emit(new, now_ms=clock.now_ms())

    await asyncio.gather(*(one(n) for n in news))


async def publish_bulk(
    store: SqlStore,
    redis: streams.Redis,
    keys: Keys,
    clock: Clock,
    news: Sequence[NewInstance],
) -> None:
    outbox = Outbox(store, redis, keys)
    for start in range(0, len(news), BULK_CHUNK):
        part = news[start : start + BULK_CHUNK]
        await asyncio.gather(*(outbox.emit(n, now_ms=clock.now_ms()) for n in part))
