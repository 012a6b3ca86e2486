"""The sweeper's move of an instance to FAILED `poison`, conditioned like every status write."""

from __future__ import annotations

from taskstream.core.outbox import seen_on_stream
from taskstream.core.states import FailClass, Status, can_transition
from taskstream.core.store.port import InstanceRow, Store


async def fail_as_poison(store: Store, row: InstanceRow, reason: str) -> bool:
    """Fail `row`'s instance as poison (`reason` as its error). False when the move lost its
    CAS: the row moved on meanwhile (a second delivery was claimed and runs, the run ended,
    another sweeper failed it, its owner's heartbeat extended the lease)."""
    status = row.status
    if status in (Status.PENDING, Status.RETRYING):
        # Its entry is on the stream, so the row moves on to DISPATCHED first, as a claim
        # would: PENDING cannot fail, and the history should show the publish it missed.
        status = await seen_on_stream(store, row.id, status, row.attempt) or status
    if not can_transition(status, Status.FAILED):
        return False
    moved = await store.transition(
        row.id,
        status,
        Status.FAILED,
        reason="poison",
        attempt=row.attempt,
        fail_class=FailClass.POISON,
        error=reason,
        # For a run, only while its lease is as it was read: a heartbeat since proves the
        # owner alive.
        lease_until=row.lease_expires_at_ms if status is Status.RUNNING else None,
    )
    return moved.ok
