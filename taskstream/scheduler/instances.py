"""What a fire time becomes: its trigger and its instance row (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from taskstream.core.errors import TaskstreamError
from taskstream.core.spec import TaskSpec, business_date, instance_id_for, render_dedupe_key
from taskstream.core.store.port import NewInstance
from taskstream.scheduler.ticks import Trigger


def on_demand(spec: TaskSpec) -> bool:
    """The task has no schedule: it runs only when triggered."""
    sched = spec.schedule
    return sched is None or (sched.cron is None and sched.every is None)


def trigger_of(spec: TaskSpec) -> Trigger | None:
    """The fire-time trigger of a spec; None for on-demand tasks."""
    sched = spec.schedule
    if sched is None or on_demand(spec):
        return None
    if sched.cron is not None:
        return Trigger(
            cron=sched.cron, timezone=sched.timezone, gap=sched.dst.gap, fold=sched.dst.fold
        )
    return Trigger(every_ms=round((sched.every or 0) * 1000))


SCHEDULED = "scheduled"
"""The creation reason of an instance a scheduler pass makes for a tick."""


def scheduled_trigger(spec: TaskSpec) -> Trigger:
    """The trigger of `spec`; `TaskstreamError` for a task that runs on demand."""
    found = trigger_of(spec)
    if found is None:
        raise TaskstreamError(f"task {spec.id!r} runs on demand: it has no fire times")
    return found


def new_instance(
    spec: TaskSpec,
    fire_ms: int,
    *,
    reason: str = SCHEDULED,
    payload: dict[str, Any] | None = None,
    made_at_ms: int | None = None,
    created_by: str | None = None,
) -> NewInstance:
    """The PENDING row for one fire time of `spec` (with `payload` instead of the spec's when
    given). Its id derives from the dedupe key, so the same fire time is the same instance.

    Its `deadline` counts from the fire time, or from `made_at_ms` (epoch ms) when that is
    later: an operator's run of a past fire time (backfill, trigger `--at`) gets the whole
    deadline from when it is made, not one that passed before it existed. `created_by`: the
    operator who makes it (None for a tick), recorded with its creation."""
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
        deadline_ms=None
        if spec.deadline is None
        else max(fire_ms, made_at_ms or fire_ms) + round(spec.deadline * 1000),
        trace_id=uuid.uuid4().hex,
        reason=reason,
        created_by=created_by,
    )


def tick_instance_id(spec: TaskSpec, fire_ms: int) -> str:
    """The id of the instance a scheduler pass makes for the fire time `fire_ms` (the one
    `new_instance(spec, fire_ms)` has), without building the row."""
    return instance_id_for(render_dedupe_key(spec, fire_ms, dict(spec.payload)))


def business_date_of(spec: TaskSpec, fire_ms: int) -> str:
    """The business date (ISO) of a fire time in the task's timezone (UTC without one)."""
    tz = spec.schedule.timezone if spec.schedule else None
    return business_date(datetime.fromtimestamp(fire_ms / 1000, tz=UTC), tz)
