"""Overlap policy `replace`: the previous unfinished instances of a task (every one that
fires before the new one) give way to it. Not yet started -> SKIPPED; otherwise FAILED with
class `replaced`. A run in progress loses its lease with that CAS: its executor's next
heartbeat cancels it, and its late commit is fenced."""

from __future__ import annotations

from taskstream.core.errors import StoreCorrupt
from taskstream.core.logging import get_logger
from taskstream.core.states import FailClass, Status, can_transition
from taskstream.core.store.port import CasResult, InstanceRow, Store
from taskstream.scheduler.verdict import Decision

MAX_TRIES = 5
"""CAS tries before giving up on a row that keeps moving (each lost try means it moved on:
dispatched, claimed, retried)."""


def replaced_ids(decision: Decision) -> list[str]:
    """The instances a `replace` run cancels, from its decision's `details["replace"]`."""
    named = decision.details.get("replace")
    return [i for i in named if isinstance(i, str)] if isinstance(named, list) else []


async def cancel_previous(store: Store, instance_id: str, *, by_fire_ms: int) -> bool:
    """Cancel `instance_id` for the run of `by_fire_ms`; False when it settled first, or its
    row cannot be read (it holds what taskstream never writes: logged, left as it is, and no
    run can be made of it).

    The row is read, then moved from the status read. A CAS lost to another move (the outbox's
    dispatch, a claim, a retry) is tried again from where the row is now: giving up after one
    loss would leave the previous run going beside the new one."""
    log = get_logger(instance_id=instance_id)
    reason = f"replaced by the run of {by_fire_ms}"
    for _ in range(MAX_TRIES):
        try:
            row = await store.get_instance(instance_id)
        except StoreCorrupt as exc:
            log.error("instance.unreadable", error=str(exc)[:300])
            return False
        if row is None:
            return False
        cas = await _cancel(store, row, reason)
        if cas is None:
            return False
        if cas.ok:
            log.info("instance.replaced", from_status=row.status, task_id=row.task_id)
            return True
        log.info("instance.replace_lost", from_status=row.status, now_status=cas.found)
    log.warning("instance.replace_gave_up", tries=MAX_TRIES)
    return False


async def _cancel(store: Store, row: InstanceRow, reason: str) -> CasResult | None:
    """The CAS that cancels `row` from its status; None when it is settled."""
    if row.status is Status.PENDING:
        return await store.transition(
            row.id, row.status, Status.SKIPPED, reason=reason, attempt=row.attempt
        )
    if can_transition(row.status, Status.FAILED):
        return await store.transition(
            row.id,
            row.status,
            Status.FAILED,
            reason=reason,
            attempt=row.attempt,
            fail_class=FailClass.REPLACED,
        )
    return None
