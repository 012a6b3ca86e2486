"""Fire-time precision of the scheduler: how late after its fire time each tick's entry is
XADDed, with 50 tasks firing every second for a while (5 minutes by default).

The lateness of a tick is the XADD time (the millisecond part of its stream entry id: the Redis
server's clock) minus its `scheduled_for_ms` (in the entry). Redis, MariaDB and the scheduler
run on this host, and the scheduler aligns its clock with the database clock, so both ends are
read from the same clock. No executor runs: entries stay on the stream to be read afterwards.

    python -m bench.fire [--tasks 50] [--seconds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.common import (
    Children,
    Services,
    apply_tasks,
    delete_keys,
    percentile,
    role_env,
    say,
    temp_database,
    unique,
)
from taskstream.core.protocol import Keys
from taskstream.core.store.migrate import upgrade
from taskstream.core.store.sql import SqlStore


def tasks_yaml(count: int) -> str:
    lines = [
        f"  - {{id: f{i}, agent: echo, schedule: {{every: 1s}}, window: 1m}}" for i in range(count)
    ]
    return "tasks:\n" + "\n".join(lines) + "\n"


async def lateness(redis: aioredis.Redis, keys: Keys) -> list[int]:
    """Lateness (ms) of every entry on the work streams."""
    out: list[int] = []
    for stream in keys.streams():
        start = "-"
        while True:
            rows: Any = await redis.xrange(stream, start, "+", count=1000)
            for entry_id, fields in rows:
                added_ms = int(entry_id.split(b"-")[0])
                out.append(added_ms - int(fields[b"scheduled_for_ms"]))
            if len(rows) < 1000:
                break
            start = "(" + rows[-1][0].decode()
    return out


async def run_fire(svc: Services, tasks: int, seconds: float, logdir: Path) -> dict[str, float]:
    """One run; returns p50/p99/max lateness (ms) and the tick count."""
    namespace = unique("fire")
    redis = aioredis.Redis.from_url(svc.redis_url)
    children = Children(logdir)
    try:
        async with temp_database(svc) as db:
            url = svc.database_url(db)
            await upgrade(url)
            store = await SqlStore.connect(url)
            try:
                await apply_tasks(store, tasks_yaml(tasks))
            finally:
                await store.close()
            env = role_env(svc, db, namespace, TASKSTREAM_LOG_LEVEL="warning")
            children.start("scheduler", [svc.python, "-m", "taskstream", "scheduler"], env)
            await asyncio.sleep(seconds + 5)  # the measured period itself, not a correctness wait
            await children.stop()
            values = await lateness(redis, Keys("ts", namespace))
    finally:
        await children.stop()
        await delete_keys(redis, f"ts:{{{namespace}}}:*")
        await redis.aclose()
    values = values[tasks * 5 :]  # the first seconds include process start-up
    return {
        "ticks": len(values),
        "p50_ms": percentile(values, 0.50),
        "p99_ms": percentile(values, 0.99),
        "max_ms": float(max(values, default=0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fire")
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ts-fire-") as tmp:
        result = asyncio.run(run_fire(Services.from_env(), args.tasks, args.seconds, Path(tmp)))
    say(
        f"fire-time lateness, {args.tasks} tasks every 1 s for {args.seconds:g} s: "
        f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
        f"max {result['max_ms']:.0f} ms over {result['ticks']:.0f} ticks "
        f"({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
