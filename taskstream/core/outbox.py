"""The outbox (DESIGN.md §6.1): INSERT PENDING -> XADD -> CAS PENDING->DISPATCHED.

A crash between the steps leaves a PENDING row; the reconciler publishes such rows again, so
no fire time is lost, and the UNIQUE dedupe key makes sure none is doubled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from taskstream.core import streams
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys, Priority, WorkEntry
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow, NewInstance, Store

EmitOutcome = Literal["published", "duplicate"]


@dataclass(frozen=True, slots=True)
class Emitted:
    """What emitting one instance did. `instance_id` names the row that exists now."""

    outcome: EmitOutcome
    instance_id: str
    status: Status | None = None


@dataclass(frozen=True, slots=True)
class Outbox:
    """Publishes instances from the store to the work streams."""

    store: Store
    redis: streams.Redis
    keys: Keys

    async def emit(self, new: NewInstance, *, now_ms: int) -> Emitted:
        """Create the instance and publish it. A duplicate dedupe key publishes nothing, even
        when the existing row is still PENDING: its creator is publishing it right now, or
        crashed, and then the reconciler publishes it once it is older than its grace."""
        created = await self.store.create_instance(new)
        row = await self.store.get_instance(created.instance_id)
        if not created.created or row is None:
            return Emitted("duplicate", created.instance_id, row.status if row else None)
        await self.publish(row, now_ms=now_ms)
        return Emitted("published", row.id, Status.DISPATCHED)

    async def publish(self, row: InstanceRow, *, now_ms: int) -> None:
        """XADD the row's entry, then move it to DISPATCHED: CAS PENDING or RETRYING ->
        DISPATCHED (a DISPATCHED row whose entry was lost is only published again). Losing
        the CAS is normal: an executor that already saw the entry may have moved the row on."""
        entry = WorkEntry(
            instance_id=row.id,
            task_id=row.task_id,
            agent=row.agent,
            attempt=row.attempt,
            scheduled_for_ms=row.scheduled_for_ms,
            emitted_at_ms=now_ms,
            trace_id=row.trace_id,
        )
        await streams.publish(self.redis, self.keys, Priority(row.priority), entry)
        if row.status not in (Status.PENDING, Status.RETRYING):
            return
        cas = await self.store.transition(
            row.id, row.status, Status.DISPATCHED, reason="published", attempt=row.attempt
        )
        if not cas.ok:
            get_logger(instance_id=row.id, task_id=row.task_id).info(
                "instance.dispatch_cas_lost", found=cas.found
            )
