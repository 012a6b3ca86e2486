"""What the sweeper reads before it decides on a pending entry: the facts `sweep.decide`
takes, read only where the verdict depends on them, so a healthy run costs no extra read."""

from __future__ import annotations

from dataclasses import dataclass

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.protocol import Keys, WorkEntry
from taskstream.core.states import (
    AWAITING_CLAIM,
    Status,
    failed_as_poison,
    last_failure,
    life_began,
)
from taskstream.core.store.port import HistoryRow, InstanceRow, Store
from taskstream.executor import handover
from taskstream.executor.retry import owner_losses
from taskstream.executor.sweep import EntryFacts, ReleaseNote, RowFacts


@dataclass(frozen=True, slots=True)
class SweepFacts:
    """The reads of one sweep pass; `now_ms` is the database clock (epoch ms)."""

    store: Store
    redis: streams.Redis
    keys: Keys
    now_ms: int

    async def gather(
        self, p: admin.Pending, entry: WorkEntry, row: InstanceRow | None, alive: bool
    ) -> tuple[EntryFacts, RowFacts | None]:
        """The entry's and the row's facts; `alive`: the entry's consumer's liveness key."""
        history = await self._history(row, alive)
        note = await self._release_note(row, alive)
        facts = EntryFacts(
            entry.attempt,
            p.deliveries,
            alive,
            owner_losses(history),
            p.idle_ms,
            p.consumer,
            earlier_deliveries=entry.redeliveries,
            released=note,
        )
        return facts, _row_facts(row, history)

    async def _history(self, row: InstanceRow | None, alive: bool) -> list[HistoryRow]:
        """The instance's history where the verdict depends on it, else none (not read): the
        runs that lost their owner, for an entry awaiting its claim or a run whose owner is
        gone; the life the row is in, for a row that FAILED as poison."""
        if row is None:
            return []
        awaiting = row.status in AWAITING_CLAIM
        orphaned = row.status is Status.RUNNING and not alive
        if awaiting or orphaned or failed_as_poison(row.status, row.fail_class):
            return await self.store.history(row.id)
        return []

    async def _release_note(self, row: InstanceRow | None, alive: bool) -> ReleaseNote | None:
        """The release a stopped owner noted for a RUNNING row it no longer holds (owner gone
        or lease expired); not looked up for a held run."""
        if row is None or row.status is not Status.RUNNING:
            return None
        expires = row.lease_expires_at_ms
        if alive and expires is not None and expires > self.now_ms:
            return None
        return await handover.noted(self.redis, self.keys, row)


def _row_facts(row: InstanceRow | None, history: list[HistoryRow]) -> RowFacts | None:
    if row is None:
        return None
    return RowFacts(
        row.status,
        row.attempt,
        row.lease_expires_at_ms,
        row.fail_class,
        row.lease_owner,
        life_began=life_began((h.reason, h.attempt) for h in history),
        failed_with=last_failure((h.to_status, h.reason) for h in history),
    )
