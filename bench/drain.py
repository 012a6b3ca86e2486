"""(b) taskstream draining pre-published no-op instances with executor processes.

A fresh database is migrated, one on-demand task (agent `echo`) is applied, N instances are
published (see `bench.publish` for the two equivalent ways), then the executors start
(`python -m taskstream executor --concurrency C`, default settings otherwise) and the store is
polled with `count_by_status` until all N are SUCCESS (or a deadline passes).

Two figures: the drain rate from the first claim to the last commit, both read from the
history rows (`at_ms`, database clock: what (a) measures, first read to last ack), and the
wall rate from starting the executor processes until the poll saw all N SUCCESS (includes the
processes' start-up, about a second of imports and connecting).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from bench import cpu
from bench.common import (
    Children,
    Services,
    executor_argv,
    per_instance,
    role_env,
    say,
    server_counters,
)
from bench.publish import Mode, instances, publish
from bench.stage import Stage, staged
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.timesync import synced_clock

TASKS = """
tasks:
  - id: bench-echo
    agent: echo
    payload: {n: 1}
"""
EXECUTORS = 2
POLL_S = 0.2
FIRST_FIRE_MS = 1_800_000_000_000


@dataclass(frozen=True, slots=True)
class DrainResult:
    instances: int
    concurrency: int
    publish_mode: str
    publish_s: float
    drain_s: float
    """First claim to last SUCCESS commit, database clock."""
    wall_s: float
    """Executor processes started to all SUCCESS seen by the poll."""
    success: int
    cpu: dict[str, float]
    """CPU seconds by category (`bench.cpu`) from starting the executors to the end."""
    steady_cpu: dict[str, float]
    """The same from the first poll that saw a SUCCESS to the end: no process start-up."""
    steady_instances: int
    """Instances that reached SUCCESS in that span."""
    claim_batches: int
    commit_batches: int
    calls: dict[str, float]
    """Server commands per instance (`common.server_counters`) while draining."""

    def cpu_ms_per_instance(self, category: str) -> float:
        return self.cpu.get(category, 0.0) * 1000 / self.instances

    def steady_ms_per_instance(self, category: str) -> float:
        """CPU ms per instance while draining (start-up left out); 0 when no span was seen."""
        if self.steady_instances <= 0:
            return 0.0
        return self.steady_cpu.get(category, 0.0) * 1000 / self.steady_instances

    @property
    def rate(self) -> float:
        return self.instances / self.drain_s if self.drain_s > 0 else 0.0

    @property
    def wall_rate(self) -> float:
        return self.instances / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def publish_rate(self) -> float:
        return self.instances / self.publish_s if self.publish_s > 0 else 0.0


async def run_drain(
    svc: Services,
    n: int,
    *,
    concurrency: int,
    mode: Mode,
    logdir: Path,
    profile: Path | None = None,
) -> DrainResult:
    async with staged(svc, "b", TASKS) as stage:
        return await _measure(
            svc,
            stage,
            n,
            concurrency=concurrency,
            mode=mode,
            logdir=logdir,
            profile=profile,
        )


async def _measure(
    svc: Services,
    stage: Stage,
    n: int,
    *,
    concurrency: int,
    mode: Mode,
    logdir: Path,
    profile: Path | None,
) -> DrainResult:
    store = stage.store
    publish_s = await prepublish(stage, n, mode, "(b)")

    children = Children(logdir)
    env = role_env(svc, stage.database, stage.namespace)
    spy: subprocess.Popen[bytes] | None = None
    before = cpu.snapshot()
    counted = await server_counters(svc)
    started = time.monotonic()
    for i in range(EXECUTORS):
        pid = children.start(f"executor-{i}", executor_argv(svc, concurrency), env)
        if profile is not None and i == 0:
            spy = _py_spy(svc, pid, profile)
    success = 0
    steady: tuple[cpu.Snapshot, int] | None = None
    deadline = started + max(120.0, n / 100)
    try:
        while time.monotonic() < deadline:
            success = (await store.count_by_status()).counts[Status.SUCCESS]
            if success >= n:
                break
            if steady is None and success > 0:
                steady = (cpu.snapshot(), success)
            if dead := children.exited():
                raise RuntimeError(f"an executor exited: {dead} (logs: {logdir})")
            await asyncio.sleep(POLL_S)
        wall_s = time.monotonic() - started
        after = cpu.snapshot()
        used = cpu.usage(before, after)
        steady_used = {} if steady is None else cpu.usage(steady[0], after)
        steady_n = 0 if steady is None else success - steady[1]
        calls = per_instance(counted, await server_counters(svc), n)
    finally:
        codes = await children.stop()
        if spy is not None:
            spy.wait(timeout=60)
    first_claim, last_success = await _span(store)
    claims, commits = await _batches(store)
    drain_s = (last_success - first_claim) / 1000 if first_claim and last_success else 0.0
    result = DrainResult(
        n,
        concurrency,
        mode,
        publish_s,
        drain_s,
        wall_s,
        success,
        used,
        steady_used,
        steady_n,
        claims,
        commits,
        calls,
    )
    say(
        f"(b) drained {success}/{n}: {result.rate:,.0f}/s first claim -> last commit "
        f"({drain_s:.2f} s), {result.wall_rate:,.0f}/s from process start ({wall_s:.2f} s);"
        f" executors exited {sorted(codes.values())}; mean batch: claim"
        f" {n / max(claims, 1):.0f}, commit {n / max(commits, 1):.0f}; CPU ms/instance: "
        + ", ".join(f"{k} {result.cpu_ms_per_instance(k):.2f}" for k in cpu.CATEGORIES)
        + f"; while draining ({steady_n} instances): "
        + ", ".join(f"{k} {result.steady_ms_per_instance(k):.3f}" for k in cpu.CATEGORIES)
        + "; per instance: "
        + ", ".join(f"{k} {v:.2f}" for k, v in calls.items())
    )
    return result


async def prepublish(stage: Stage, n: int, mode: Mode, label: str) -> float:
    """Publish `n` instances of the echo task; returns the seconds it took."""
    store = stage.store
    spec = parse_task_file_text(TASKS, "bench.yaml").tasks[0]
    clock = await synced_clock(store)
    news = instances(spec, n, FIRST_FIRE_MS)
    started = time.monotonic()
    await publish(mode, store, stage.redis, stage.keys, clock, news)
    publish_s = time.monotonic() - started
    dispatched = (await store.count_by_status()).counts[Status.DISPATCHED]
    say(f"{label} published {n} ({mode}) in {publish_s:.1f} s; {dispatched} DISPATCHED")
    return publish_s


async def _batches(store: SqlStore) -> tuple[int, int]:
    """How many claim and commit statements there were: history rows written by one
    statement share (owner, at_ms), so distinct pairs count statements (a lower bound)."""
    pairs = select(hist.c.owner, hist.c.at_ms).distinct()
    async with store.engine.connect() as conn:
        out: list[int] = []
        for status in (Status.RUNNING, Status.SUCCESS):
            sub = pairs.where(hist.c.to_status == status.value).subquery()
            out.append(
                int((await conn.execute(select(func.count()).select_from(sub))).scalar_one())
            )
    return out[0], out[1]


async def _span(store: SqlStore) -> tuple[int | None, int | None]:
    """(first RUNNING at_ms, last SUCCESS at_ms) from the history, database clock."""
    async with store.engine.connect() as conn:
        first = (
            await conn.execute(
                select(func.min(hist.c.at_ms)).where(hist.c.to_status == Status.RUNNING.value)
            )
        ).scalar_one_or_none()
        last = (
            await conn.execute(
                select(func.max(hist.c.at_ms)).where(hist.c.to_status == Status.SUCCESS.value)
            )
        ).scalar_one_or_none()
    return (None if first is None else int(first), None if last is None else int(last))


def _py_spy(svc: Services, pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample one executor with py-spy (raw collapsed stacks) until it exits."""
    spy = Path(svc.python).with_name("py-spy")
    argv = [str(spy), "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    argv += ["--output", str(out), "--nonblocking"]
    say(f"(b) profiling executor pid {pid} with py-spy -> {out}")
    return subprocess.Popen(  # noqa: S603 - the venv's py-spy on our own child
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
