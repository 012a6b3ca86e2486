"""Gathering what `decide_tick` needs to know about one tick: the task's other active
instance (unless `concurrency: allow`) and, under `replace`, every earlier one, its missing
ready markers and its precondition results, read from the store and the precondition
checks."""

from __future__ import annotations

from taskstream.core.preconditions import Check, CheckResult, evaluate
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import InstanceRow, Store, UnreadableRow
from taskstream.scheduler.decide import readiness_checked
from taskstream.scheduler.instances import business_date_of
from taskstream.scheduler.verdict import (
    ActiveInstance,
    Decision,
    TickFacts,
    held_for_maintenance,
)

ACTIVE_READ = 10
"""Active instances read per tick, oldest fire time first."""
UNREADABLE = "unreadable"
"""The status an active run whose row cannot be read is shown with in overlap decisions."""
REPLACE_READ = 1000
"""Active instances read per tick under `concurrency: replace`, which cancels every earlier
one (a backfill may have left many); more than that are cancelled by the next ticks."""


async def tick_facts(
    store: Store,
    checks: dict[str, Check],
    spec: TaskSpec,
    fire_ms: int,
    *,
    catchup: bool,
    previous: Decision | None,
) -> TickFacts:
    """Facts for the tick at `fire_ms` (epoch ms). Readiness (markers and preconditions) is
    read only when `decide.readiness_checked` says the tick checks it; otherwise every
    precondition counts as passed and no marker as missing."""
    active: ActiveInstance | None = None
    earlier: tuple[str, ...] = ()
    if spec.concurrency != "allow":
        limit = REPLACE_READ if spec.concurrency == "replace" else ACTIVE_READ
        rows = await _active(store, spec.id, limit)
        active = _other_active(rows, fire_ms)
        if spec.concurrency == "replace":
            earlier = tuple(r.id for r in rows if r.scheduled_for_ms < fire_ms)
    missing: tuple[str, ...] = ()
    results: dict[str, CheckResult] = dict.fromkeys(spec.preconditions, "pass")
    after_maintenance = catchup and held_for_maintenance(previous)
    if readiness_checked(spec, catchup=catchup, after_maintenance=after_maintenance):
        day = business_date_of(spec, fire_ms)
        found = await store.ready_markers(list(spec.depends_on), day)
        missing = tuple(m for m in spec.depends_on if m not in found)
        results = await evaluate(checks, list(spec.preconditions), spec.id, day)
    return TickFacts(
        fire_ms,
        active,
        missing,
        results,
        catchup,
        previous.decision if previous else None,
        previous.until_ms if previous else None,
        after_maintenance,
        earlier,
    )


async def _active(store: Store, task_id: str, limit: int) -> list[InstanceRow | UnreadableRow]:
    """The oldest `limit` active instances, oldest fire time first; when there may be more,
    the newest one last, so that `_other_active` still sees a later run (the newest active
    instance fires later than the tick whenever any does). A row that cannot be read (a hand
    edit in SQL) is among them: it is not settled, so it is still an active run."""
    rows = await store.active_instances(task_id, limit=limit)
    if len(rows) < limit:
        return rows
    newest = await store.active_instances(task_id, limit=1, newest_first=True)
    return rows + [r for r in newest if r.id not in {row.id for row in rows}]


def _other_active(rows: list[InstanceRow | UnreadableRow], fire_ms: int) -> ActiveInstance | None:
    """The active instance a tick at `fire_ms` overlaps with, from `rows` (oldest fire time
    first): the newest one that fires later when there is one, since `replace` must not
    cancel a newer run; else the oldest earlier one."""
    others = [r for r in rows if r.scheduled_for_ms != fire_ms]
    later = [r for r in others if r.scheduled_for_ms > fire_ms]
    other = later[-1] if later else next(iter(others), None)
    if other is None:
        return None
    status = other.status.value if isinstance(other, InstanceRow) else UNREADABLE
    return ActiveInstance(other.id, status, other.scheduled_for_ms)
