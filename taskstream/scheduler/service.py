"""The scheduler loop: reload definitions, decide every due tick, emit through the outbox,
sleep until the next fire time (capped so definition changes and stop requests are seen)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any
from datetime import UTC, datetime

from taskstream.core.clock import Clock
from taskstream.core.definitions import DefinitionCache
from taskstream.core.logging import get_logger
from taskstream.core.outbox import Outbox
from taskstream.core.spec import TaskSpec, business_date, instance_id_for, render_dedupe_key
from taskstream.core.store.port import DecisionRow, NewInstance, Store
from taskstream.scheduler.decide import SKIP_DUPLICATED, Decision, decide_window
from taskstream.scheduler.ticks import Trigger, fire_times, next_fire

MAX_TICKS_PER_PASS = 100
MAX_RETRIES_PER_PASS = 1000
"""Bound on fire times decided per task per pass, so a long outage cannot flood a pass."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """`max_sleep_s`: longest sleep between passes (seconds)."""

    max_sleep_s: float = 1.0


def trigger_of(spec: TaskSpec) -> Trigger | None:
    """The fire-time trigger of a spec; None for on-demand tasks."""
    sched = spec.schedule
    if sched is None or (sched.cron is None and sched.every is None):
        return None
    if sched.cron is not None:
        return Trigger(
            cron=sched.cron, timezone=sched.timezone, gap=sched.dst.gap, fold=sched.dst.fold
        )
    return Trigger(every_ms=round((sched.every or 0) * 1000))


def new_instance(
    spec: TaskSpec,
    fire_ms: int,
    *,
    reason: str = "scheduled",
    payload: dict[str, Any] | None = None,
) -> NewInstance:
    """The PENDING row for one fire time of `spec` (with `payload` instead of the spec's when
    given). Its id derives from the dedupe key, so the same fire time is the same instance."""
    tz = spec.schedule.timezone if spec.schedule else None
    body = dict(spec.payload) if payload is None else dict(payload)
    key = render_dedupe_key(spec, fire_ms, body)
    return NewInstance(
        id=instance_id_for(key),
        task_id=spec.id,
        agent=spec.agent,
        dedupe_key=key,
        scheduled_for_ms=fire_ms,
        priority=spec.priority.value,
        business_date=business_date(datetime.fromtimestamp(fire_ms / 1000, tz=UTC), tz),
        payload=body,
        max_attempts=spec.retry.max_attempts,
        deadline_ms=None if spec.deadline is None else fire_ms + round(spec.deadline * 1000),
        trace_id=uuid.uuid4().hex,
        reason=reason,
    )


class Scheduler:
    """One scheduler process. Correctness never depends on it being alone: the store's UNIQUE
    dedupe key turns a double fire into `skip_duplicated`."""

    def __init__(self, store: Store, outbox: Outbox, clock: Clock, config: SchedulerConfig) -> None:
        self._store = store
        self._outbox = outbox
        self._clock = clock
        self._config = config
        self._defs = DefinitionCache(store)
        self._log = get_logger(role="scheduler")

    async def run(self, stop: asyncio.Event) -> None:
        """Run passes until `stop` is set."""
        self._log.info("scheduler.started")
        while not stop.is_set():
            next_due_ms = await self.run_pass()
            wait_s = self._config.max_sleep_s
            if next_due_ms is not None:
                wait_s = min(wait_s, max(0.0, (next_due_ms - self._clock.now_ms()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait_s)
        self._log.info("scheduler.stopped")

    async def run_pass(self) -> int | None:
        """Decide every due tick of every active task; returns the next fire time (ms), or
        None when no active task has a schedule."""
        if await self._defs.refresh():
            self._log.info("scheduler.definitions_loaded", count=len(self._defs.current.specs))
        now_ms = self._clock.now_ms()
        await self._emit_due_retries(now_ms)
        next_due: int | None = None
        for task_id, spec in self._defs.current.specs.items():
            trigger = trigger_of(spec)
            if trigger is None or task_id in self._defs.current.paused:
                continue
            cursor = await self._advance(spec, trigger, now_ms)
            upcoming = next_fire(trigger, cursor)
            next_due = upcoming if next_due is None else min(next_due, upcoming)
        return next_due

    async def _emit_due_retries(self, now_ms: int) -> None:
        """Publish RETRYING rows whose next attempt is due (RETRYING -> DISPATCHED)."""
        for row in await self._store.due_retries(now_ms=now_ms, limit=MAX_RETRIES_PER_PASS):
            await self._outbox.publish(row, now_ms=now_ms)
            self._log.info(
                "retry.emitted", instance_id=row.id, task_id=row.task_id, attempt=row.attempt
            )

    async def _advance(self, spec: TaskSpec, trigger: Trigger, now_ms: int) -> int:
        cursor = await self._store.get_cursor(spec.id)
        if cursor is None:
            cursor = now_ms - 1
            await self._store.set_cursor(spec.id, cursor)
        for fire_ms in fire_times(trigger, cursor, now_ms, limit=MAX_TICKS_PER_PASS):
            decision = decide_window(fire_ms, now_ms, round(spec.window * 1000))
            await self._apply(spec, fire_ms, decision, now_ms)
            await self._store.set_cursor(spec.id, fire_ms)
            cursor = fire_ms
        return cursor

    async def _apply(self, spec: TaskSpec, fire_ms: int, decision: Decision, now_ms: int) -> None:
        instance_id = None
        if decision.runs:
            emitted = await self._outbox.emit(new_instance(spec, fire_ms), now_ms=now_ms)
            instance_id = emitted.instance_id
            if emitted.outcome == "duplicate":
                decision = Decision(
                    SKIP_DUPLICATED,
                    "an instance with this dedupe key exists",
                    {**decision.details, "status": str(emitted.status)},
                )
        row = DecisionRow(
            spec.id,
            fire_ms,
            decision.decision,
            decision.reason,
            decision.details,
            instance_id,
            now_ms,
        )
        await self._store.record_decision(row)
        self._log.info(
            "trigger.decided",
            task_id=spec.id,
            fire_time_ms=fire_ms,
            decision=decision.decision,
            instance_id=instance_id,
        )
