"""Overlap policy `replace`: the previous unfinished instance of a task gives way to the new
one. Not yet started -> SKIPPED; otherwise FAILED with class `replaced`. A run in progress
loses its lease with that CAS: its executor's next heartbeat cancels it, and its late commit
is fenced."""

from __future__ import annotations

from taskstream.core.logging import get_logger
from taskstream.core.states import FailClass, Status, can_transition
from taskstream.core.store.port import Store


async def cancel_previous(store: Store, instance_id: str, *, by_fire_ms: int) -> bool:
    """Cancel `instance_id` for the run of `by_fire_ms`; False when it settled meanwhile."""
    row = await store.get_instance(instance_id)
    if row is None:
        return False
    reason = f"replaced by the run of {by_fire_ms}"
    if row.status is Status.PENDING:
        cas = await store.transition(
            row.id, row.status, Status.SKIPPED, reason=reason, attempt=row.attempt
        )
    elif can_transition(row.status, Status.FAILED):
        cas = await store.transition(
            row.id,
            row.status,
            Status.FAILED,
            reason=reason,
            attempt=row.attempt,
            fail_class=FailClass.REPLACED,
        )
    else:
        return False
    get_logger(instance_id=row.id, task_id=row.task_id).info(
        "instance.replaced", ok=cas.ok, from_status=row.status
    )
    return cas.ok
