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
        if not created.created:
            row = await self.store.get_instance(created.instance_id)
            return Emitted("duplicate", created.instance_id, row.status if row else None)
        entry = WorkEntry(
            instance_id=new.id,
            task_id=new.task_id,
            agent=new.agent,
            attempt=0,
            scheduled_for_ms=new.scheduled_for_ms,
            emitted_at_ms=now_ms,
            trace_id=new.trace_id,
        )
        await self._dispatch(entry, Priority(new.priority), Status.PENDING)
        return Emitted("published", new.id, Status.DISPATCHED)

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
        await self._dispatch(entry, Priority(row.priority), row.status)

    async def _dispatch(self, entry: WorkEntry, priority: Priority, status: Status) -> None:
        """XADD, then CAS `status` -> DISPATCHED when the row was PENDING or RETRYING."""
        await streams.publish(self.redis, self.keys, priority, entry)
        if status not in (Status.PENDING, Status.RETRYING):
            return
        cas = await self.store.transition(
            entry.instance_id,
            status,
            Status.DISPATCHED,
            reason="published",
            attempt=entry.attempt,
        )
        if not cas.ok:
            get_logger(instance_id=entry.instance_id, task_id=entry.task_id).info(
                "instance.dispatch_cas_lost", found=cas.found
            )
