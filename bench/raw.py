"""(a) The durable raw limit: Redis Streams + MariaDB with no framework.

N entries (the same fields a taskstream work entry has) are XADDed in pipelines to one stream,
with N rows `DISPATCHED` in a throwaway InnoDB table. Two consumer processes in one consumer
group then loop, per batch: XREADGROUP COUNT 100, one CAS
`UPDATE items SET status='RUNNING' WHERE id IN (...) AND status='DISPATCHED'` (autocommit),
one CAS `UPDATE ... SET status='SUCCESS' WHERE id IN (...) AND status='RUNNING'` (autocommit),
then XACK + XDEL in one MULTI. A consumer stops at its first empty read (everything was
published before it started) or at its deadline. The figure is N divided by the time from the
first read of either consumer to the last ack of either (host clock, one host).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from bench import cpu
from bench.common import (
    Barrier,
    Services,
    delete_keys,
    mysql_connect,
    run_workers,
    say,
    temp_database,
    unique,
)

GROUP = "raw"
BATCH = 100
PUBLISH_CHUNK = 1000
CONSUMERS = 2
DEADLINE_S = 120.0


@dataclass(frozen=True, slots=True)
class RawResult:
    entries: int
    seconds: float
    success_rows: int
    batches: int
    cpu: dict[str, float]
    """CPU seconds by category (`bench.cpu`; "bench" is the consumers) while draining."""

    def cpu_ms_per_entry(self, category: str) -> float:
        return self.cpu.get(category, 0.0) * 1000 / max(self.entries, 1)

    @property
    def rate(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def of(cls, results: list[dict[str, Any]], used: dict[str, float], success: int) -> RawResult:
        """The figure from the consumers' reports (`first`/`last` host times, `done`,
        `batches`, `cpu_s`) and the CPU of the servers over the run."""
        firsts = [r["first"] for r in results if r["first"] is not None]
        lasts = [r["last"] for r in results if r["last"] is not None]
        seconds = (max(lasts) - min(firsts)) if firsts and lasts else 0.0
        done = sum(int(r["done"]) for r in results)
        batches = sum(int(r["batches"]) for r in results)
        used = used | {"bench": sum(float(r["cpu_s"]) for r in results)}
        return cls(done, seconds, success, batches, used)

    def summary(self) -> str:
        return (
            f"{self.entries} entries in {self.seconds:.3f} s = {self.rate:,.0f}/s"
            f" ({self.success_rows} SUCCESS); CPU ms/entry: consumers"
            f" {self.cpu_ms_per_entry('bench'):.3f}, MariaDB"
            f" {self.cpu_ms_per_entry('mariadb'):.3f}, Redis {self.cpu_ms_per_entry('redis'):.3f}"
        )


@dataclass(frozen=True, slots=True)
class Job:
    """One consumer process of a raw loop: where it reads and writes, and how."""

    svc: Services
    database: str
    streams: tuple[str, ...]
    consumer: str
    group: str
    count: int
    """Entries per XREADGROUP (per stream)."""
    transactions: bool = False
    """False: autocommit; True: the batch's statements commit themselves (`conn.commit()`)."""
    setup: tuple[str, ...] = ()
    """Session statements run once before the loop."""


BatchSql = Callable[[Job, Any, Any, list[str]], Awaitable[None]]
"""(job, cursor, connection, instance ids of one read): send one batch's statements."""


def _entry(instance_id: str, now_ms: int) -> dict[str, str]:
    return {
        "v": "1",
        "instance_id": instance_id,
        "task_id": "raw",
        "agent": "echo",
        "attempt": "0",
        "scheduled_for_ms": str(now_ms),
        "emitted_at_ms": str(now_ms),
        "trace_id": uuid.uuid4().hex,
    }


async def _prepare(svc: Services, database: str, stream: str, n: int) -> None:
    conn = await mysql_connect(svc, database)
    redis = aioredis.Redis.from_url(svc.redis_url)
    try:
        async with conn.cursor() as cur:
            await cur.execute(
                "CREATE TABLE items (id VARCHAR(64) NOT NULL PRIMARY KEY,"
                " status VARCHAR(16) NOT NULL) ENGINE=InnoDB"
            )
            ids = [f"i_{uuid.uuid4().hex[:24]}" for _ in range(n)]
            for start in range(0, n, PUBLISH_CHUNK):
                part = ids[start : start + PUBLISH_CHUNK]
                values = ",".join(["(%s, 'DISPATCHED')"] * len(part))
                await cur.execute(f"INSERT INTO items (id, status) VALUES {values}", part)  # noqa: S608
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        now_ms = int(time.time() * 1000)
        for start in range(0, n, PUBLISH_CHUNK):
            async with redis.pipeline(transaction=False) as pipe:
                for instance_id in ids[start : start + PUBLISH_CHUNK]:
                    pipe.xadd(stream, _entry(instance_id, now_ms))  # type: ignore[arg-type]
                await pipe.execute()
    finally:
        conn.close()
        await redis.aclose()


async def consume(job: Job, barrier: Barrier, batch_sql: BatchSql) -> dict[str, Any]:
    """Loop until the first empty read or `DEADLINE_S`: XREADGROUP, `batch_sql` for the
    entries of each stream read, XACK + XDEL in one MULTI. Returns the host times of the first
    read and the last ack, the counts, and this process's CPU seconds."""
    redis = aioredis.Redis.from_url(job.svc.redis_url)
    conn = await mysql_connect(job.svc, job.database)
    await conn.autocommit(not job.transactions)
    await redis.ping()
    barrier.arrive()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_start = usage.ru_utime + usage.ru_stime
    first: float | None = None
    last: float | None = None
    done = batches = 0
    deadline = time.monotonic() + DEADLINE_S
    streams: Any = dict.fromkeys(job.streams, ">")
    try:
        async with conn.cursor() as cur:
            for statement in job.setup:
                await cur.execute(statement)
            while time.monotonic() < deadline:
                started = time.time()
                reply: Any = await redis.xreadgroup(
                    job.group, job.consumer, streams, count=job.count
                )
                if not reply:
                    break
                first = started if first is None else first
                for stream, entries in reply:
                    entry_ids = [e[0] for e in entries]
                    ids = [e[1][b"instance_id"].decode() for e in entries]
                    await batch_sql(job, cur, conn, ids)
                    async with redis.pipeline(transaction=True) as pipe:
                        pipe.xack(stream, job.group, *entry_ids)
                        pipe.xdel(stream, *entry_ids)
                        await pipe.execute()
                    done += len(entry_ids)
                    batches += 1
                last = time.time()
    finally:
        conn.close()
        await redis.aclose()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = usage.ru_utime + usage.ru_stime - cpu_start
    return {"first": first, "last": last, "done": done, "batches": batches, "cpu_s": cpu_s}


async def _two_updates(job: Job, cur: Any, conn: Any, ids: list[str]) -> None:
    """(a)'s statements: two autocommit CAS UPDATEs."""
    await cur.execute(_cas("RUNNING", "DISPATCHED", len(ids)), ids)
    await cur.execute(_cas("SUCCESS", "RUNNING", len(ids)), ids)


def _cas(dst: str, src: str, n: int) -> str:
    """`UPDATE items SET status=dst WHERE id IN (%s x n) AND status=src` (constants only)."""
    marks = ",".join(["%s"] * n)
    return f"UPDATE items SET status='{dst}' WHERE id IN ({marks}) AND status='{src}'"  # noqa: S608


def _consumer_main(job: Job, barrier: Barrier, out: mp.Queue[Any]) -> None:
    out.put(asyncio.run(consume(job, barrier, _two_updates)))


async def run_raw(svc: Services, n: int) -> RawResult:
    """One measurement of the raw limit with `n` entries."""
    stream = unique("tsbench:raw:")
    redis = aioredis.Redis.from_url(svc.redis_url)
    try:
        async with temp_database(svc) as database:
            await _prepare(svc, database, stream, n)
            jobs = [
                Job(svc, database, (stream,), f"raw-{i}", GROUP, BATCH) for i in range(CONSUMERS)
            ]
            before = cpu.snapshot()
            results = await run_workers(_consumer_main, jobs, DEADLINE_S + 30)
            used = cpu.usage(before, cpu.snapshot())
            success = await _count_success(svc, database)
    finally:
        await delete_keys(redis, stream)
        await redis.aclose()
    result = RawResult.of(results, used, success)
    say(f"(a) raw: {result.summary()}")
    return result


async def _count_success(svc: Services, database: str) -> int:
    conn = await mysql_connect(svc, database)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT COUNT(*) FROM items WHERE status='SUCCESS'")
            row = await cur.fetchone()
            return int(row[0])
    finally:
        conn.close()
