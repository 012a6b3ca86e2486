"""The work entry that publishes an instance: built from a new instance or from a stored row,
and why a row can have none."""

from __future__ import annotations

from pydantic import ValidationError

from taskstream.core.protocol import Priority, WorkEntry
from taskstream.core.store.port import InstanceRow, NewInstance


def placed_entry(row: InstanceRow, now_ms: int) -> tuple[Priority, WorkEntry]:
    """`row`'s stream and entry (`row_entry`). `ValueError` when the row cannot have one (a
    value the stream protocol refuses); `why_refused` names it."""
    return Priority.of(row.priority), row_entry(row, now_ms)


def why_refused(exc: ValueError) -> str:
    """One line naming the field a row's entry could not take, and why."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )[:300]
    return str(exc)[:300]


def row_entry(row: InstanceRow, now_ms: int) -> WorkEntry:
    """The work entry that publishes `row`'s current attempt, emitted at `now_ms` (ms)."""
    return WorkEntry(
        instance_id=row.id,
        task_id=row.task_id,
        agent=row.agent,
        attempt=row.attempt,
        scheduled_for_ms=row.scheduled_for_ms,
        emitted_at_ms=now_ms,
        trace_id=row.trace_id,
    )


def new_entry(new: NewInstance, now_ms: int) -> WorkEntry:
    """The work entry of `new`'s first attempt, emitted at `now_ms` (ms)."""
    return WorkEntry(
        instance_id=new.id,
        task_id=new.task_id,
        agent=new.agent,
        attempt=0,
        scheduled_for_ms=new.scheduled_for_ms,
        emitted_at_ms=now_ms,
        trace_id=new.trace_id,
    )
