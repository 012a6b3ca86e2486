"""Shared plumbing of the benchmarks: throwaway databases and Redis namespaces, child
processes, task definitions, and the statistics of the results table.

Only resources created here are removed: databases named `ts_bench_<hex>` (dropped when their
block ends) and Redis keys under a namespace made for one run (deleted with SCAN MATCH + DEL).
Child processes are stopped by their own pid, SIGTERM first, SIGKILL after a bounded wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import asyncmy
import redis.asyncio as aioredis

from taskstream.core.definitions import to_records
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.store.sql import SqlStore

ROOT = Path(__file__).resolve().parents[1]
DB_PREFIX = "ts_bench_"
STOP_WAIT_S = 15.0
DB_NOW_SQL = "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"


@dataclass(frozen=True, slots=True)
class Services:
    """Where Redis and MariaDB answer, and the interpreter for child processes."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    mysql_host: str = "127.0.0.1"
    mysql_port: int = 3306
    mysql_user: str = "root"
    python: str = sys.executable

    def database_url(self, name: str) -> str:
        return f"mysql://{self.mysql_user}@{self.mysql_host}:{self.mysql_port}/{name}"

    @classmethod
    def from_env(cls) -> Services:
        """The servers `scripts/lib/services.sh` found (`TASKSTREAM_TEST_REDIS_URL`,
        `TASKSTREAM_TEST_MYSQL_URL`), else the defaults on 127.0.0.1."""
        svc = cls()
        redis_url = os.environ.get("TASKSTREAM_TEST_REDIS_URL") or svc.redis_url
        mysql = urlsplit(os.environ.get("TASKSTREAM_TEST_MYSQL_URL") or "mysql://root@127.0.0.1")
        return cls(
            redis_url=redis_url,
            mysql_host=mysql.hostname or svc.mysql_host,
            mysql_port=mysql.port or svc.mysql_port,
            mysql_user=mysql.username or svc.mysql_user,
        )


def unique(prefix: str) -> str:
    """A short unique name: `prefix` + 12 hex digits."""
    return prefix + uuid.uuid4().hex[:12]


async def mysql_connect(svc: Services, db: str | None = None) -> Any:
    """A raw asyncmy connection (autocommit), for the framework-free parts."""
    logging.getLogger("asyncmy").setLevel(logging.ERROR)  # notes such as "database exists"
    return await asyncmy.connect(
        host=svc.mysql_host,
        port=svc.mysql_port,
        user=svc.mysql_user,
        password="",
        database=db,
        autocommit=True,
        connect_timeout=10,
    )


async def mysql_exec(svc: Services, *statements: str, db: str | None = None) -> None:
    conn = await mysql_connect(svc, db)
    try:
        async with conn.cursor() as cur:
            for statement in statements:
                await cur.execute(statement)
    finally:
        conn.close()


async def mysql_value(svc: Services, sql: str, db: str | None = None) -> Any:
    conn = await mysql_connect(svc, db)
    try:
        async with conn.cursor() as cur:
            await cur.execute(sql)
            row = await cur.fetchone()
            return None if row is None else row[0]
    finally:
        conn.close()


COUNTERS = (
    "Questions",
    "Com_admin_commands",
    "Com_commit",
    "Com_rollback",
    "Bytes_received",
    "Bytes_sent",
)


async def server_counters(svc: Services) -> dict[str, int]:
    """Server-wide counters: MariaDB statements (`Questions`; pings count as
    `Com_admin_commands`), commits, rollbacks, bytes in and out, and Redis commands
    processed. They include any foreign load on the same servers."""
    conn = await mysql_connect(svc)
    try:
        async with conn.cursor() as cur:
            marks = ",".join(["%s"] * len(COUNTERS))
            await cur.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({marks})", COUNTERS)
            out = {str(k): int(v) for k, v in await cur.fetchall()}
    finally:
        conn.close()
    redis = aioredis.Redis.from_url(svc.redis_url)
    try:
        info = await redis.info("stats")
        out["redis_commands"] = int(info["total_commands_processed"])
    finally:
        await redis.aclose()
    return out


def per_instance(before: Mapping[str, int], after: Mapping[str, int], n: int) -> dict[str, float]:
    return {k: (after[k] - before.get(k, 0)) / max(n, 1) for k in after}


@asynccontextmanager
async def temp_database(svc: Services) -> AsyncIterator[str]:
    """A fresh empty database `ts_bench_<hex>`; yields its name and drops it afterwards."""
    name = unique(DB_PREFIX)
    await mysql_exec(svc, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        yield name
    finally:
        await mysql_exec(
            svc, "SET SESSION lock_wait_timeout = 30", f"DROP DATABASE IF EXISTS `{name}`"
        )


async def delete_keys(redis: aioredis.Redis, match: str) -> int:
    """Delete the keys matching `match` (SCAN MATCH + DEL, never FLUSH*); returns how many."""
    deleted = 0
    batch: list[bytes] = []
    async for key in redis.scan_iter(match=match, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += int(await redis.delete(*batch))
            batch = []
    if batch:
        deleted += int(await redis.delete(*batch))
    return deleted


async def apply_tasks(store: SqlStore, text: str, agent_modules: Sequence[str] = ()) -> None:
    """Validate a task file's text and write its definitions to the store."""
    from taskstream.agents.registry import default_registry  # noqa: PLC0415 - optional layer

    registry = default_registry(tuple(agent_modules))
    taskfile = parse_task_file_text(text, "bench.yaml", known_agents=registry.names())
    await store.upsert_definitions(to_records(taskfile))


def role_env(svc: Services, database: str, namespace: str, **extra: str) -> dict[str, str]:
    """The environment of a taskstream role: the process environment without any
    `TASKSTREAM_*` left over, plus the cluster's URLs and namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env |= {
        "TASKSTREAM_REDIS_URL": svc.redis_url,
        "TASKSTREAM_DATABASE_URL": svc.database_url(database),
        "TASKSTREAM_NAMESPACE": namespace,
        "PYTHONPATH": str(ROOT),
    }
    env |= extra
    return env


class Children:
    """Child processes started by one benchmark run, stopped by pid when it ends."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
        log = (self.logdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            list(argv), env=dict(env), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append((name, proc, log))
        return proc.pid

    def pids(self, prefix: str = "") -> dict[int, str]:
        return {p.pid: n for n, p, _ in self.procs if n.startswith(prefix)}

    def exited(self) -> dict[str, int]:
        return {n: rc for n, p, _ in self.procs if (rc := p.poll()) is not None}

    async def stop(self, wait_s: float = STOP_WAIT_S) -> dict[str, int]:
        """SIGTERM every live child, wait up to `wait_s`, SIGKILL what is left; exit codes."""
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for _, proc, _ in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, max(0.0, deadline - time.monotonic()))
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                await asyncio.to_thread(proc.wait, 10)
        codes = {name: int(proc.returncode) for name, proc, _ in self.procs}
        for _, _, log in self.procs:
            log.close()
        return codes


def executor_argv(svc: Services, concurrency: int | None = None) -> list[str]:
    argv = [svc.python, "-m", "taskstream", "executor"]
    return argv if concurrency is None else [*argv, "--concurrency", str(concurrency)]


async def wait_alive(
    redis: aioredis.Redis, namespace: str, count: int, children: Children, timeout_s: float = 60
) -> None:
    """Wait until `count` executors of `namespace` have set their liveness key."""
    deadline = time.monotonic() + timeout_s
    match = f"ts:{{{namespace}}}:alive:*"
    while time.monotonic() < deadline:
        found = [k async for k in redis.scan_iter(match=match, count=1000)]
        if len(found) >= count:
            return
        if dead := children.exited():
            raise RuntimeError(f"a child exited during start-up: {dead} (logs: {children.logdir})")
        await asyncio.sleep(0.05)
    raise RuntimeError(f"executors of {namespace} not alive after {timeout_s:.0f} s")


# worker processes (spawned, not forked: the parent holds event loops and sockets)

Worker = Callable[[Any, "Barrier", "mp.Queue[Any]"], None]


@dataclass(frozen=True, slots=True)
class Barrier:
    """Start line for worker processes: each says it is ready, all start on `go`."""

    ready: MpEvent
    go: MpEvent

    def arrive(self, timeout_s: float = 120.0) -> None:
        self.ready.set()
        self.go.wait(timeout=timeout_s)


async def run_workers(target: Worker, jobs: Sequence[Any], timeout_s: float) -> list[Any]:
    """Run `target(job, barrier, out)` in one process per job; they start together once all
    are ready; returns what each put on `out` (in no particular order). A worker that dies,
    or a run over `timeout_s`, raises; workers left are killed by pid."""
    ctx = mp.get_context("spawn")
    out: mp.Queue[Any] = ctx.Queue()
    go = ctx.Event()
    barriers = [Barrier(ctx.Event(), go) for _ in jobs]
    procs = [
        ctx.Process(target=target, args=(job, b, out), daemon=True)
        for job, b in zip(jobs, barriers, strict=True)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 120
        while not all(b.ready.is_set() for b in barriers):
            _check_workers(procs, deadline, "did not get ready")
            await asyncio.sleep(0.02)
        go.set()
        results: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(results) < len(procs):
            try:
                results.append(out.get_nowait())
                continue
            except queue.Empty:
                pass
            _check_workers(procs, deadline, "did not finish")
            await asyncio.sleep(0.02)
        return results
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 10)
            if p.is_alive():
                p.kill()
                await asyncio.to_thread(p.join, 10)


def _check_workers(procs: Sequence[Any], deadline: float, what: str) -> None:
    failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
    if failed:
        raise RuntimeError(f"a worker process failed with exit code {failed}")
    if time.monotonic() > deadline:
        raise RuntimeError(f"worker processes {what} in time")


# statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) by the nearest-rank method."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def median(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def say(message: str) -> None:
    """Progress on stderr (the results table goes to stdout)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()
