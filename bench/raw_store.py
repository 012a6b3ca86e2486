"""(a2) The raw loop with taskstream's own statements: what the store design costs without
the framework.

The instances are published as for (b) (same task, same outbox, real schema), then two
consumer processes in the `executors` group loop like (a), but per batch of up to 200 (an
executor's `--concurrency`) they send exactly the statements a taskstream executor sends for
a full batch, written out by hand over asyncmy:

- claim, one transaction: the rows read whole `FOR UPDATE` with the database clock, the CAS
  UPDATE DISPATCHED -> RUNNING (attempt + 1, lease), the history rows (INSERT ... SELECT);
- finish, one transaction: the CAS UPDATE RUNNING -> SUCCESS with the result, the history
  rows;
- then XACK + XDEL in one MULTI.

Nothing is decoded, validated, run or logged. So (a2)/(a) is the cost of the schema and the
record of every change; (b)/(a2) is the cost of the framework around the same SQL.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Awaitable, Callable
from typing import Any

from bench import cpu
from bench.common import Barrier, Services, run_workers, say
from bench.drain import TASKS, prepublish
from bench.raw import DEADLINE_S, Job, RawResult, consume
from bench.stage import staged
from taskstream.core.protocol import GROUP
from taskstream.core.states import Status
from taskstream.core.store.tables import INSTANCE_COLUMNS

BATCH = 200
CONSUMERS = 2
_COLUMNS = ", ".join(c.name for c in INSTANCE_COLUMNS)
"""Every stored column (not the generated `settled`), as the store's locked read selects
them."""
_DB_NOW = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
LEASE_MS = 150_000
READ_COMMITTED = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
"""The store's session isolation (`taskstream.core.store.sql_engine`)."""


def _marks(n: int) -> str:
    return ",".join(["%s"] * n)


def lock_sql(n: int) -> str:
    return (
        f"SELECT {_COLUMNS}, {_DB_NOW} AS db_now_ms FROM task_instances"  # noqa: S608 - constants and %s marks only
        f" WHERE id IN ({_marks(n)}) ORDER BY id FOR UPDATE"
    )


def claim_sql(n: int) -> str:
    return (
        "UPDATE task_instances SET status='RUNNING', attempt=attempt + 1, fail_class=NULL,"  # noqa: S608 - constants and %s marks only
        " lease_owner=%s, lease_expires_at_ms=%s, next_attempt_at_ms=NULL, updated_at_ms=%s"
        f" WHERE status='DISPATCHED' AND attempt=0 AND id IN ({_marks(n)})"
    )


def finish_sql(n: int) -> str:
    return (
        "UPDATE task_instances SET status='SUCCESS', result=%s, fail_class=NULL,"  # noqa: S608 - constants and %s marks only
        " lease_owner=NULL, lease_expires_at_ms=NULL, next_attempt_at_ms=NULL,"
        f" updated_at_ms={_DB_NOW} WHERE status='RUNNING' AND attempt=1 AND id IN ({_marks(n)})"
    )


def history_sql(src: Status, n: int) -> str:
    return (
        "INSERT INTO instance_history (instance_id, from_status, to_status, attempt, owner,"  # noqa: S608 - constants and %s marks only
        f" reason, at_ms) SELECT id, '{src.value}', status, attempt, %s, %s, updated_at_ms"
        f" FROM task_instances WHERE id IN ({_marks(n)})"
    )


Timed = Callable[[str, Awaitable[Any]], Awaitable[None]]
"""(statement name, its call): await the call, e.g. timing it (`bench.statements`)."""


async def _untimed(_name: str, call: Awaitable[Any]) -> None:
    await call


async def run_batch(
    cur: Any, conn: Any, consumer: str, ids: list[str], timed: Timed = _untimed
) -> None:
    """One executor batch's SQL: claim transaction, then finish transaction."""
    n = len(ids)
    await timed("lock read (SELECT ... FOR UPDATE)", cur.execute(lock_sql(n), ids))
    now_ms = int((await cur.fetchall())[0][-1])
    claim = [consumer, now_ms + LEASE_MS, now_ms, *ids]
    await timed("claim CAS UPDATE", cur.execute(claim_sql(n), claim))
    history = history_sql(Status.DISPATCHED, n)
    await timed("claim history INSERT", cur.execute(history, [consumer, "claimed", *ids]))
    await timed("claim COMMIT", conn.commit())
    await timed("finish CAS UPDATE", cur.execute(finish_sql(n), ['{"n":1}', *ids]))
    history = history_sql(Status.RUNNING, n)
    await timed("finish history INSERT", cur.execute(history, [consumer, "completed", *ids]))
    await timed("finish COMMIT", conn.commit())


async def _batch(job: Job, cur: Any, conn: Any, ids: list[str]) -> None:
    await run_batch(cur, conn, job.consumer, ids)


def _consumer_main(job: Job, barrier: Barrier, out: mp.Queue[Any]) -> None:
    out.put(asyncio.run(consume(job, barrier, _batch)))


async def run_raw_store(svc: Services, n: int) -> RawResult:
    """One measurement of (a2) with `n` instances published as for (b)."""
    async with staged(svc, "a2", TASKS) as stage:
        await prepublish(stage, n, "bulk", "(a2)")
        names = tuple(stage.keys.streams())
        jobs = [
            Job(svc, stage.database, names, f"raw-{i}", GROUP, BATCH, True, (READ_COMMITTED,))
            for i in range(CONSUMERS)
        ]
        before = cpu.snapshot()
        results = await run_workers(_consumer_main, jobs, DEADLINE_S + 30)
        used = cpu.usage(before, cpu.snapshot())
        success = (await stage.store.count_by_status()).counts[Status.SUCCESS]
    result = RawResult.of(results, used, success)
    say(f"(a2) raw with taskstream's statements: {result.summary()}")
    return result
