"""A small in-process cluster for integration tests: real Redis, real store, fixed clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.definitions import DefinitionCache, from_record, to_records
from taskstream.core.outbox import Outbox
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import Keys, Priority
from taskstream.core.spec import TaskSpec
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.executor.reconciler import Reconciler
from taskstream.executor.recovery import Recovery
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.executor.sweeper import Sweeper, SweeperConfig
from taskstream.scheduler.service import Scheduler, SchedulerConfig, new_instance

T0 = 1_780_000_000_000


@dataclass
class Harness:
    """Builds the parts of a cluster around one store and one Redis namespace."""

    store: SqlStore
    redis: streams.Redis
    keys: Keys
    clock: FixedClock = field(default_factory=lambda: FixedClock(T0))
    registry_modules: tuple[str, ...] = ("tests.agents",)

    async def apply(self, text: str) -> None:
        registry = default_registry(self.registry_modules)
        taskfile = parse_task_file_text(text, "t.yaml", known_agents=registry.names())
        await self.store.upsert_definitions(to_records(taskfile), now_ms=self.clock.now_ms())
        await streams.ensure_groups(self.redis, self.keys)

    async def definitions(self) -> list[TaskSpec]:
        return [from_record(r) for r in await self.store.list_definitions()]

    @property
    def outbox(self) -> Outbox:
        return Outbox(self.store, self.redis, self.keys)

    async def trigger(self, text: str, task_id: str, fire_ms: int = T0) -> InstanceRow:
        """Emit one instance of `task_id` (defined in `text`) for `fire_ms`."""
        spec = next(t for t in parse_task_file_text(text, "t.yaml").tasks if t.id == task_id)
        emitted = await self.outbox.emit(new_instance(spec, fire_ms), now_ms=self.clock.now_ms())
        row = await self.store.get_instance(emitted.instance_id)
        assert row is not None
        return row

    async def pending_on_stream(self, text: str, task_id: str) -> InstanceRow:
        """A PENDING instance of `task_id` whose entry is on the stream: the outbox's XADD
        landed, its CAS to DISPATCHED not yet."""
        spec = next(t for t in parse_task_file_text(text, "t.yaml").tasks if t.id == task_id)
        created = await self.store.create_instance(new_instance(spec, self.clock.now_ms()))
        row = await self.store.get_instance(created.instance_id)
        assert row is not None and row.status is Status.PENDING
        entry = row_entry(row, self.clock.now_ms())
        await streams.publish_many(self.redis, self.keys, [(Priority.DEFAULT, entry)])
        return row

    def executor(self, consumer: str = "c1", **config: Any) -> Executor:
        deps = ExecutorDeps(
            self.store,
            self.redis,
            self.keys,
            default_registry(self.registry_modules),
            self.clock,
            Random(7),
        )
        return Executor(deps, ExecutorConfig(consumer=consumer, block_ms=20, **config))

    def scheduler(self) -> Scheduler:
        return Scheduler(self.store, self.outbox, self.clock, SchedulerConfig())

    async def run_until(self, instance_id: str, *wanted: Status) -> None:
        """Run an executor until the instance reaches one of `wanted`, then close it."""

        async def reached() -> bool:
            row = await self.store.get_instance(instance_id)
            return row is not None and row.status in wanted

        ex = Running(self.executor())
        try:
            await until(reached)
        finally:
            await ex.close()

    def reconciler(self, **config: Any) -> Reconciler:
        recovery = Recovery(self.store, DefinitionCache(self.store), Random(7))
        return Reconciler(self.store, self.redis, self.keys, self.clock, recovery, **config)

    def sweeper(self, **config: Any) -> Sweeper:
        return Sweeper(
            self.store, self.redis, self.keys, self.clock, SweeperConfig(**config), Random(7)
        )


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """Wait for an event the test caused; the timeout only bounds a broken run."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


class Running:
    """An executor running in the background of a test."""

    def __init__(self, executor: Executor) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(executor.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=30)
