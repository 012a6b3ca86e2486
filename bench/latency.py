"""(c) Enqueue-to-start latency at a steady rate.

N executor processes run (`python -m taskstream executor --concurrency C`; `scripts/bench`
uses one, and two for comparison); publisher processes emit instances through
`taskstream.core.outbox.Outbox.emit` on a fixed schedule (together `rate` per second for
`seconds`; instance k is due at start + k / rate whatever happened before, so a slow emit does
not lower the rate). Afterwards the store answers, per instance, on the database clock:
latency = `at_ms` of the RUNNING history row (the claim) minus `at_ms` of the creation history
row (the INSERT of the PENDING row, the outbox's first step). So the figure includes the whole
outbox (INSERT, XADD, CAS to DISPATCHED), the executor's read and its claim transaction.

Also reported: the rate actually achieved (instances over the span of their creation rows), and
how late the publishers started emits against their schedule (a publisher that cannot keep up
shows here, not as a lower rate of the schedule).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import aliased

from bench import cpu
from bench.common import (
    Barrier,
    Children,
    Services,
    executor_argv,
    per_instance,
    percentile,
    role_env,
    run_workers,
    say,
    server_counters,
    wait_alive,
)
from bench.stage import Stage, staged
from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.logging import configure
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.reasons import SEEN_ON_STREAM
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.timesync import synced_clock
from taskstream.scheduler.service import new_instance

TASKS = """
tasks:
  - id: bench-latency
    agent: echo
    payload: {n: 1}
"""
FIRST_FIRE_MS = 1_800_000_000_000
SETTLE_S = 60.0
LATE_S = 1.0
"""A publisher that is further behind its schedule than this when the window ends stops: the
instances not emitted by then are reported as skipped, so a run never outlasts its window much."""
IN_FLIGHT = 12
"""Emits in flight per publisher: below the size of the store's connection pool, so that a
publisher that falls behind queues here, visibly (publish lag), instead of timing out on it."""


@dataclass(frozen=True, slots=True)
class LatencyResult:
    executors: int
    instances: int
    target_rate: float
    achieved_rate: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    publish_lag_p99_ms: float
    emit_p50_ms: float
    to_dispatched_p50_ms: float
    """Creation -> the outbox's DISPATCHED history row (INSERT, commit, XADD, CAS), p50."""
    to_running_p50_ms: float
    """DISPATCHED history row -> RUNNING (the executor's read and claim), p50."""
    skipped: int
    """Instances of the schedule not emitted because the publishers fell too far behind."""
    raced: int
    """Instances an executor saw on the stream before the outbox's CAS to DISPATCHED."""
    cpu: dict[str, float]
    """CPU seconds by category (`bench.cpu`) from the first emit until all were SUCCESS."""
    calls: dict[str, float]
    """Server commands per instance (`common.server_counters`), same span."""

    def cpu_ms_per_instance(self, category: str) -> float:
        return self.cpu.get(category, 0.0) * 1000 / max(self.instances, 1)


@dataclass(frozen=True, slots=True)
class _PubJob:
    svc: Services
    database: str
    namespace: str
    index: int
    publishers: int
    rate: float
    seconds: float


@dataclass(slots=True)
class _Schedule:
    """Emits `news` through the outbox, item k due at `start` + k * `interval`."""

    outbox: Outbox
    clock: Clock
    news: list[NewInstance]
    interval: float
    lags: list[float] = field(default_factory=list)
    emits: list[float] = field(default_factory=list)
    skipped: int = 0

    async def run(self, start: float, stop_at: float) -> None:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def emit(k: int, due: float) -> None:
            async with gate:
                started = time.monotonic()
                if started > stop_at:  # too far behind: the window is over
                    self.skipped += 1
                    return
                self.lags.append(started - due)
                await self.outbox.emit(self.news[k], now_ms=self.clock.now_ms())
                self.emits.append(time.monotonic() - started)

        running: set[asyncio.Task[None]] = set()
        for k in range(len(self.news)):
            due = start + k * self.interval
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(emit(k, due))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _publish(job: _PubJob, barrier: Barrier) -> dict[str, Any]:
    store = await SqlStore.connect(job.svc.database_url(job.database))
    redis = streams.connect(job.svc.redis_url)
    try:
        spec = parse_task_file_text(TASKS, "bench.yaml").tasks[0]
        count = round(job.rate * job.seconds / job.publishers)
        news = [
            new_instance(spec, FIRST_FIRE_MS + k * job.publishers + job.index) for k in range(count)
        ]
        schedule = _Schedule(
            Outbox(store, redis, Keys(namespace=job.namespace)),
            await synced_clock(store),
            news,
            job.publishers / job.rate,
        )
        await asyncio.gather(*(store.ping() for _ in range(4)))  # a warm connection pool
        await redis.ping()
        barrier.arrive()
        cpu_start = _cpu_s()
        start = time.monotonic() + 0.2 + job.index / job.rate
        await schedule.run(start, start + job.seconds + LATE_S)
        return {
            "count": len(schedule.emits),
            "skipped": schedule.skipped,
            "lags": schedule.lags,
            "emits": schedule.emits,
            "cpu_s": _cpu_s() - cpu_start,
        }
    finally:
        await store.close()
        await redis.aclose()


def _publisher_main(job: _PubJob, barrier: Barrier, out: mp.Queue[Any]) -> None:
    configure("warning")  # the load generator: its `dispatch_cas_lost` notes are expected
    out.put(asyncio.run(_publish(job, barrier)))


async def run_latency(
    svc: Services,
    *,
    rate: float,
    seconds: float,
    concurrency: int,
    publishers: int,
    executors: int,
    logdir: Path,
) -> LatencyResult:
    children = Children(logdir)
    async with staged(svc, "c", TASKS) as stage:
        try:
            env = role_env(svc, stage.database, stage.namespace)
            for i in range(executors):
                children.start(f"executor-{i}", executor_argv(svc, concurrency), env)
            await wait_alive(stage.redis, stage.namespace, executors, children)
            total, published, used, calls = await _drive(
                svc, stage, children, rate, seconds, publishers
            )
            codes = await children.stop()
            result = await _figures(
                stage.store, published, total, used, calls, rate=rate, executors=executors
            )
        finally:
            await children.stop()  # before the stage's database is dropped
    say(
        f"(c) {executors} executor(s), {total} at {result.achieved_rate:,.0f}/s (target"
        f" {rate:g}, {result.skipped} not emitted in time): p50"
        f" {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms, max {result.max_ms:.0f} ms;"
        f" publish lag p99 {result.publish_lag_p99_ms:.0f} ms; executors exited"
        f" {sorted(codes.values())}; emit p50 {result.emit_p50_ms:.1f} ms; created ->"
        f" DISPATCHED p50 {result.to_dispatched_p50_ms:.0f} ms, -> RUNNING p50"
        f" {result.to_running_p50_ms:.0f} ms; raced"
        f" {result.raced}; CPU ms/instance: "
        + ", ".join(f"{k} {used[k] * 1000 / max(total, 1):.2f}" for k in cpu.CATEGORIES)
        + "; per instance: "
        + ", ".join(f"{k} {v:.1f}" for k, v in calls.items())
    )
    return result


async def _drive(
    svc: Services, stage: Stage, children: Children, rate: float, seconds: float, publishers: int
) -> tuple[int, list[dict[str, Any]], dict[str, float], dict[str, float]]:
    """Run the publishers until every instance they emitted is SUCCESS; returns the count,
    what each publisher reported, CPU seconds by category and server commands per instance."""
    jobs = [
        _PubJob(svc, stage.database, stage.namespace, i, publishers, rate, seconds)
        for i in range(publishers)
    ]
    before = cpu.snapshot()
    counted = await server_counters(svc)
    published = await run_workers(_publisher_main, jobs, seconds + 120)
    total = sum(int(p["count"]) for p in published)
    await _settle(stage.store, total, children)
    used = cpu.usage(before, cpu.snapshot())
    calls = per_instance(counted, await server_counters(svc), total)
    used["bench"] += sum(float(p["cpu_s"]) for p in published)
    return total, published, used, calls


async def _settle(store: SqlStore, total: int, children: Children) -> None:
    deadline = time.monotonic() + SETTLE_S
    counts: dict[Status, int] = {}
    while time.monotonic() < deadline:
        counts = (await store.count_by_status()).counts
        if counts[Status.SUCCESS] >= total:
            return
        if dead := children.exited():
            raise RuntimeError(f"an executor exited: {dead} (logs: {children.logdir})")
        await asyncio.sleep(0.2)
    left = ", ".join(f"{s.value} {n}" for s, n in counts.items() if n and s is not Status.SUCCESS)
    say(
        f"(c) not all {total} instances were SUCCESS after {SETTLE_S:.0f} s ({left}; the"
        " executors' logs are kept with --keep-logs)"
    )


async def _figures(
    store: SqlStore,
    published: list[dict[str, Any]],
    total: int,
    used: dict[str, float],
    calls: dict[str, float],
    *,
    rate: float,
    executors: int,
) -> LatencyResult:
    """The figures of one run at `rate` with `executors`, from the history rows and the
    publishers' reports."""
    times, raced = await _history_times(store)
    pairs = [(a, b) for a, _, b in times]
    latencies = [float(b - a) for a, b in pairs]
    starts = [a for a, _ in pairs]
    span_s = (max(starts) - min(starts)) / 1000 if len(starts) > 1 else 0.0
    lags = [x * 1000 for p in published for x in p["lags"]]
    emits = [x * 1000 for p in published for x in p["emits"]]
    if len(pairs) < total:
        say(f"(c) only {len(pairs)} of {total} instances have a RUNNING row")
    return LatencyResult(
        executors=executors,
        instances=len(pairs),
        target_rate=rate,
        achieved_rate=(len(pairs) - 1) / span_s if span_s > 0 else 0.0,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=max(latencies, default=float("nan")),
        publish_lag_p99_ms=percentile(lags, 99),
        emit_p50_ms=percentile(emits, 50),
        to_dispatched_p50_ms=percentile([float(d - a) for a, d, _ in times], 50),
        to_running_p50_ms=percentile([float(b - d) for _, d, b in times], 50),
        skipped=sum(int(p["skipped"]) for p in published),
        raced=raced,
        cpu=used,
        calls=calls,
    )


def _step(table: Any, src: Any, status: Status, attempt: int) -> Any:
    """Join condition: `table`'s history row moving the same instance to `status` at
    `attempt`."""
    return and_(
        table.c.instance_id == src.c.instance_id,
        table.c.to_status == status.value,
        table.c.attempt == attempt,
    )


async def _history_times(store: SqlStore) -> tuple[list[tuple[int, int, int]], int]:
    """(created, DISPATCHED, RUNNING) `at_ms` of every instance's first attempt, and how many
    claims raced the outbox's CAS (history rows `seen_on_stream`)."""
    created, dispatched, claimed = aliased(hist), aliased(hist), aliased(hist)
    stmt = (
        select(created.c.at_ms, dispatched.c.at_ms, claimed.c.at_ms)
        .join(claimed, _step(claimed, created, Status.RUNNING, 1))
        .join(dispatched, _step(dispatched, created, Status.DISPATCHED, 0))
        .where(created.c.from_status.is_(None))
    )
    raced_stmt = select(hist.c.id).where(hist.c.reason == SEEN_ON_STREAM)
    async with store.engine.connect() as conn:
        times = [(int(a), int(d), int(b)) for a, d, b in (await conn.execute(stmt)).all()]
        raced = len((await conn.execute(raced_stmt)).all())
    return times, raced
