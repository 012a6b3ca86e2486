"""Where (a2)'s database time goes: each of an executor's statements timed alone.

    python -m bench.statements [N] [--sql "ALTER TABLE ..."]...

Publishes N instances (default 20,000) as (b) does, then one consumer drains them in batches
of 200 with (a2)'s statements (`bench.raw_store`), timing each statement from send to reply.
With nothing else running, that is the server's time for the statement, per instance. `--sql`
runs statements on the fresh schema first, e.g. dropping an index to see what it costs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as aioredis

from bench import raw_store as rs
from bench.common import Services, mysql_connect, mysql_exec, say
from bench.drain import TASKS, prepublish
from bench.stage import Stage, staged
from taskstream.core.protocol import GROUP

CONSUMER = "statements"


async def _drain(stage: Stage, svc: Services) -> dict[str, float]:
    """Seconds spent in each statement over the whole drain."""
    spent: dict[str, float] = defaultdict(float)

    async def timed(name: str, call: Awaitable[Any]) -> None:
        started = time.perf_counter()
        await call
        spent[name] += time.perf_counter() - started

    streams: Any = dict.fromkeys(stage.keys.streams(), ">")
    redis = aioredis.Redis.from_url(svc.redis_url)
    conn = await mysql_connect(svc, stage.database)
    await conn.autocommit(False)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            while True:
                reply: Any = await redis.xreadgroup(GROUP, CONSUMER, streams, count=rs.BATCH)
                if not reply:
                    break
                for stream, entries in reply:
                    ids = [e[1][b"instance_id"].decode() for e in entries]
                    await rs.run_batch(cur, conn, CONSUMER, ids, timed)
                    await redis.xack(stream, GROUP, *[e[0] for e in entries])
    finally:
        conn.close()
        await redis.aclose()
    return spent


async def main(n: int, sql: list[str]) -> None:
    svc = Services.from_env()
    async with staged(svc, "st", TASKS) as stage:
        if sql:
            await mysql_exec(svc, *sql, db=stage.database)
        await prepublish(stage, n, "bulk", "(statements)")
        spent = await _drain(stage, svc)
    for name, seconds in spent.items():
        say(f"{name:36s} {seconds * 1e6 / n:6.1f} us per instance")
    say(f"{'all':36s} {sum(spent.values()) * 1e6 / n:6.1f} us per instance")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("n", type=int, nargs="?", default=20_000)
    parser.add_argument("--sql", action="append", default=[], help="run on the schema first")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.sql))
