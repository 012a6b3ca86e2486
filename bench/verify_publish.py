"""`python -m bench.verify_publish`: check that the two ways of `bench.publish` leave the same
rows, history and stream entries.

The same N instances (same ids and trace ids) are published `outbox` and `bulk` into two fresh
databases and namespaces; rows are compared on every column but `created_at_ms` and
`updated_at_ms`, history rows on every column but `id` and `at_ms`, entries on every field but
`emitted_at_ms` (times and ids assigned by the servers differ by nature). Exit status 0 when all
three are identical.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from sqlalchemy import select

from bench.common import Services
from bench.drain import TASKS
from bench.publish import Mode, instances, publish
from bench.stage import staged
from taskstream.core import streams
from taskstream.core.clock import SystemClock
from taskstream.core.protocol import Keys
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.port import NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.store.tables import task_instances as inst

VOLATILE = frozenset({"created_at_ms", "updated_at_ms"})
Snapshot = tuple[list[dict[str, Any]], list[tuple[Any, ...]], list[dict[str, str]]]


async def snapshot(store: SqlStore, redis: streams.Redis, keys: Keys) -> Snapshot:
    history_cols = [c for c in hist.c if c.name not in ("id", "at_ms")]
    async with store.engine.connect() as conn:
        rows = [
            {k: v for k, v in m.items() if k not in VOLATILE}
            for m in (await conn.execute(select(inst).order_by(inst.c.id))).mappings()
        ]
        history = [
            tuple(h)
            for h in await conn.execute(
                select(*history_cols).order_by(hist.c.instance_id, hist.c.id)
            )
        ]
    entries: list[dict[str, str]] = []
    for stream in keys.streams():
        found: Any = await redis.xrange(stream)
        for _, fields in found:
            entry = {k.decode(): v.decode() for k, v in fields.items()}
            entry.pop("emitted_at_ms")
            entries.append(entry)
    entries.sort(key=lambda e: e["instance_id"])
    return rows, history, entries


async def published(svc: Services, mode: Mode, news: list[NewInstance]) -> Snapshot:
    async with staged(svc, "v", TASKS) as stage:
        await publish(mode, stage.store, stage.redis, stage.keys, SystemClock(), news)
        return await snapshot(stage.store, stage.redis, stage.keys)


async def verify(svc: Services, n: int) -> bool:
    # One list for both ways: `new_instance` draws a fresh trace id per call.
    news = instances(parse_task_file_text(TASKS, "bench.yaml").tasks[0], n, 1_800_000_000_000)
    outbox = await published(svc, "outbox", news)
    bulk = await published(svc, "bulk", news)
    same = [a == b for a, b in zip(outbox, bulk, strict=True)]
    sys.stdout.write(
        f"{n} instances: rows identical {same[0]}, history identical {same[1]},"
        f" entries identical {same[2]}\n"
    )
    return all(same)


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    raise SystemExit(0 if asyncio.run(verify(Services.from_env(), count)) else 1)
