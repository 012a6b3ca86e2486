"""(d) Recovery after `kill -9` of the executor running a long instance.

A scheduler, a sweeper and two executors run with default settings (only the URLs, the
namespace and `TASKSTREAM_AGENT_MODULES=tests.agents` are set). One on-demand instance of the
`slow` test agent (`seconds: 10`, default retry policy) is emitted through the outbox; once it
is RUNNING for a second, the executor holding its lease (pid from `lease_owner`,
`host:pid:start`) gets SIGKILL. The database clock is read right before the kill; the figure is
the `at_ms` of the re-run's RUNNING history row (attempt 2) minus that reading.

The history also splits the time: kill -> TIMEOUT (the sweeper noticed the owner's liveness key
expired), TIMEOUT -> DISPATCHED (retry backoff, then the scheduler re-emitted it), DISPATCHED ->
RUNNING (an executor read and claimed it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Children,
    Services,
    executor_argv,
    role_env,
    say,
    wait_alive,
)
from bench.stage import Stage, staged
from taskstream.core import streams
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import HistoryRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import new_instance

TASKS = """
tasks:
  - id: bench-slow
    agent: slow
    payload: {seconds: 10}
"""
AGENT_MODULES = "tests.agents"
EXECUTORS = 2
RUNNING_FOR_S = 1.0
RECOVERY_DEADLINE_S = 90.0


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    recovery_s: float
    detect_s: float
    """Kill to the TIMEOUT history row (sweeper)."""
    reemit_s: float
    """TIMEOUT to DISPATCHED (backoff + scheduler)."""
    claim_s: float
    """DISPATCHED to RUNNING (executor)."""


async def run_recovery(svc: Services, *, logdir: Path) -> RecoveryResult:
    children = Children(logdir)
    async with staged(svc, "d", TASKS, (AGENT_MODULES,)) as stage:
        try:
            await _start_roles(svc, stage, children)
            result = await _kill_and_measure(stage.store, stage.redis, stage.keys, children)
        finally:
            await children.stop()  # before the stage's database is dropped
    say(
        f"(d) recovered in {result.recovery_s:.2f} s (detect {result.detect_s:.2f} s, re-emit"
        f" {result.reemit_s:.2f} s, claim {result.claim_s:.2f} s)"
    )
    return result


async def _start_roles(svc: Services, stage: Stage, children: Children) -> None:
    """Scheduler, sweeper and executors on the stage, each logged as started."""
    env = role_env(svc, stage.database, stage.namespace, TASKSTREAM_AGENT_MODULES=AGENT_MODULES)
    py = svc.python
    children.start("scheduler", [py, "-m", "taskstream", "scheduler"], env)
    children.start("sweeper", [py, "-m", "taskstream", "sweeper"], env)
    for i in range(EXECUTORS):
        children.start(f"executor-{i}", executor_argv(svc), env)
    await wait_alive(stage.redis, stage.namespace, EXECUTORS, children)
    await _wait_logged(children, ("scheduler.started", "sweeper.started"))


async def _wait_logged(children: Children, events: tuple[str, ...], timeout_s: float = 60) -> None:
    """Wait until every event name appears in some child's log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = "".join(
            p.read_text(errors="replace") for p in children.logdir.glob("*.log") if p.is_file()
        )
        if all(e in text for e in events):
            return
        if dead := children.exited():
            raise RuntimeError(f"a role exited during start-up: {dead} (logs: {children.logdir})")
        await asyncio.sleep(0.1)
    raise RuntimeError(f"roles did not log {events} within {timeout_s:.0f} s")


async def _kill_and_measure(
    store: SqlStore, redis: streams.Redis, keys: Keys, children: Children
) -> RecoveryResult:
    spec = parse_task_file_text(TASKS, "bench.yaml").tasks[0]
    now = await store.db_now_ms()
    emitted = await Outbox(store, redis, keys).emit(new_instance(spec, now), now_ms=now)
    instance_id = emitted.instance_id
    owner = await _running_owner(store, instance_id)
    pid = int(owner.split(":")[-2])
    if pid not in children.pids("executor"):
        raise RuntimeError(f"lease owner {owner!r} is not one of this run's executors")
    await asyncio.sleep(RUNNING_FOR_S)
    kill_ms = await store.db_now_ms()
    os.kill(pid, signal.SIGKILL)
    say(f"(d) SIGKILL executor pid {pid} running {instance_id}")
    rerun = await _rerun(store, instance_id)
    first_of = {h.to_status: h.at_ms for h in reversed(rerun)}  # earliest per status
    running = first_of[Status.RUNNING]
    timeout = first_of.get(Status.TIMEOUT, running)
    dispatched = first_of.get(Status.DISPATCHED, running)
    return RecoveryResult(
        recovery_s=(running - kill_ms) / 1000,
        detect_s=(timeout - kill_ms) / 1000,
        reemit_s=(dispatched - timeout) / 1000,
        claim_s=(running - dispatched) / 1000,
    )


async def _running_owner(store: SqlStore, instance_id: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = await store.get_instance(instance_id)
        if row is not None and row.status is Status.RUNNING and row.lease_owner:
            return row.lease_owner
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{instance_id} was not RUNNING within {timeout_s:.0f} s")


async def _rerun(store: SqlStore, instance_id: str) -> list[HistoryRow]:
    """History rows after the first run, once the second run's RUNNING row exists."""
    deadline = time.monotonic() + RECOVERY_DEADLINE_S
    while time.monotonic() < deadline:
        history = await store.history(instance_id)
        if any(h.to_status is Status.RUNNING and h.attempt >= 2 for h in history):
            first_run = next(
                i for i, h in enumerate(history) if h.to_status is Status.RUNNING and h.attempt == 1
            )
            return history[first_run + 1 :]
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{instance_id} was not re-run within {RECOVERY_DEADLINE_S:.0f} s")
