"""Pre-publishing instances for the benchmarks, two ways that leave the same rows and entries.

- `outbox`: the real path, `taskstream.core.outbox.Outbox.emit` per instance (INSERT PENDING +
  history, XADD, CAS PENDING -> DISPATCHED + history), up to 32 emits in flight.
- `bulk`: the same three steps per chunk of 500 instances: one multi-row INSERT of the PENDING
  rows with the columns `sql_instances.insert_instance` writes, plus their creation history
  rows (from NULL to PENDING, reason `scheduled`, `at_ms` copied from the row like
  `append_history` does) in one transaction; one pipeline of XADDs with the entries
  `Outbox.publish` encodes; then one CAS UPDATE `PENDING -> DISPATCHED` `WHERE id IN (...) AND
  status = 'PENDING' AND attempt = 0` with `sql_instances.status_values(DISPATCHED)` and the
  history rows via `sql_queries.append_history` (reason `published`), in one transaction.

Instances come from `scheduler.service.new_instance` (one fire time per instance, 1 ms apart),
so ids, dedupe keys, business dates and trace ids are what the scheduler would make.
`python -m bench.verify_publish` checks that both ways leave identical rows, history and entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from sqlalchemy import Insert, String, insert, literal, select, update

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys, Priority, WorkEntry, encode
from taskstream.core.spec import TaskSpec
from taskstream.core.states import Status
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import OWNER_LEN, STATUS_LEN
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.store.tables import task_instances as inst
from taskstream.scheduler.service import new_instance

Mode = Literal["outbox", "bulk"]
BULK_CHUNK = 500
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
    for start in range(0, len(news), BULK_CHUNK):
        part = news[start : start + BULK_CHUNK]
        ids = sorted(n.id for n in part)
        async with store.engine.begin() as conn:
            await conn.execute(insert(inst).values([_row(n) for n in part]))
            await conn.execute(_creation_history(ids, part[0].reason))
        async with redis.pipeline(transaction=False) as pipe:
            for n in part:
                pipe.xadd(keys.stream(Priority(n.priority)), encode(_entry(n, clock.now_ms())))  # type: ignore[arg-type]
            await pipe.execute()
        async with store.engine.begin() as conn:
            values = rows.status_values(Status.DISPATCHED, None, None, None)
            stmt = (
                update(inst)
                .where(
                    inst.c.id.in_(ids),
                    inst.c.status == Status.PENDING.value,
                    inst.c.attempt == 0,
                )
                .values(**values, updated_at_ms=db_now_ms())
            )
            await q.update_exactly(conn, stmt, len(ids), "bench dispatch")
            await q.append_history(
                conn,
                ids,
                src=Status.PENDING,
                owners=dict.fromkeys(ids, None),
                reasons=dict.fromkeys(ids, "published"),
            )


def _row(new: NewInstance) -> dict[str, object]:
    """The columns `sql_instances.insert_instance` writes."""
    return {
        "id": new.id,
        "task_id": new.task_id,
        "agent": new.agent,
        "dedupe_key": new.dedupe_key,
        "status": Status.PENDING.value,
        "attempt": 0,
        "max_attempts": new.max_attempts,
        "priority": new.priority,
        "scheduled_for_ms": new.scheduled_for_ms,
        "business_date": new.business_date,
        "payload": codec.dumps(new.payload, what="payload"),
        "context": codec.dumps({}, what="context"),
        "not_before_ms": new.not_before_ms,
        "deadline_ms": new.deadline_ms,
        "trace_id": new.trace_id,
        "created_at_ms": db_now_ms(),
        "updated_at_ms": db_now_ms(),
    }


def _creation_history(ids: Sequence[str], reason: str) -> Insert:
    source = (
        select(
            inst.c.id,
            literal(None, String(STATUS_LEN)),
            literal(Status.PENDING.value, String(STATUS_LEN)),
            inst.c.attempt,
            literal(None, String(OWNER_LEN)),
            literal(codec.reason(reason), String()),
            inst.c.updated_at_ms,
        )
        .where(inst.c.id.in_(ids))
        .order_by(inst.c.id)
    )
    columns = ["instance_id", "from_status", "to_status", "attempt", "owner", "reason", "at_ms"]
    return insert(hist).from_select(columns, source)


def _entry(new: NewInstance, now_ms: int) -> WorkEntry:
    """The entry `Outbox.publish` makes for a fresh PENDING row."""
    return WorkEntry(
        instance_id=new.id,
        task_id=new.task_id,
        agent=new.agent,
        attempt=0,
        scheduled_for_ms=new.scheduled_for_ms,
        emitted_at_ms=now_ms,
        trace_id=new.trace_id,
    )
