"""The reconciler: rows the store says are in flight but that have no entry on any work stream
(Redis restarted empty, an entry trimmed, an ack lost) are published again from the store.

Streams are scanned first and rows read after, keeping only rows untouched for `grace_ms`:
a row dispatched after the scan is younger than the grace, so it is never mistaken for lost.
A spurious republish is harmless anyway: the claim CAS turns it into an acked duplicate.
A row that cannot be read (it holds what taskstream never writes, say after a hand edit in
SQL) is passed over and logged once, as it is, while the others are fixed.

A RUNNING row without an entry is timed out when its lease has expired, or sooner when its
owner's liveness key stays absent for a TTL (`sweep.owners_lost`): Redis lost the entry and
the executor died with it, so nothing will extend the lease or commit the run.
"""

from __future__ import annotations

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.clock import Clock
from taskstream.core.logging import get_logger
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.reasons import LEASE_EXPIRED, OWNER_LOST
from taskstream.core.states import Status
from taskstream.core.store.port import InstanceRow, Store
from taskstream.core.unreadable_rows import UnreadableRows
from taskstream.executor.recovery import Recovery
from taskstream.executor.sweep import owners_lost

GRACE_MS = 15_000
"""How long a row must have been left untouched before it counts as lost (ms)."""
SCANNED = [Status.PENDING, Status.DISPATCHED, Status.RUNNING, Status.TIMEOUT]
"""The in-flight statuses the reconciler checks (RETRYING rows are emitted by the scheduler
when due)."""


class Reconciler:
    """Republishes lost work; times out RUNNING rows whose entry and lease are both gone."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        clock: Clock,
        recovery: Recovery,
        *,
        grace_ms: int = GRACE_MS,
        limit: int = 1000,
        liveness_ttl_ms: int = 6_000,
    ) -> None:
        self._store, self._clock, self._recovery = store, clock, recovery
        self._redis, self._keys = redis, keys
        self._outbox = Outbox(store, redis, keys)
        self._grace_ms, self._limit, self._ttl_ms = grace_ms, limit, liveness_ttl_ms
        self._absent_since: dict[str, int] = {}
        """Owners of entry-less runs whose liveness key the last pass found absent, and since
        when (ms)."""
        self._after: tuple[int, str] | None = None
        """(updated_at_ms, id) of the last row the previous pass read, when it read a full
        page."""
        self._log = get_logger(role="reconciler")
        self._unreadable = UnreadableRows(self._log)

    async def reconcile(self, *, liveness_trusted: bool = True) -> int:
        """One pass; returns how many rows were published again or recovered. With
        `liveness_trusted` False (Redis failed within a TTL: keys may have expired in the
        outage), an absent liveness key proves nothing and runs wait for their leases."""
        await streams.ensure_groups(self._redis, self._keys)
        live = await admin.instance_ids(self._redis, self._keys)
        now = self._clock.now_ms()
        rows = await self._store.stale(
            SCANNED, updated_before_ms=now - self._grace_ms, limit=self._limit, after=self._after
        )
        # Page on from the last row seen, and start over once past the end: rows that need
        # nothing (a live entry, a held lease) cannot hide the others behind them for good.
        self._after = (rows[-1].updated_at_ms, rows[-1].id) if len(rows) == self._limit else None
        readable = self._unreadable.readable(rows)
        lost = await self._lost_owners(readable, live, now, liveness_trusted)
        fixed = 0
        for row in readable:
            if row.id not in live and await self._fix(row, now, lost):
                fixed += 1
                self._log.info("instance.reconciled", instance_id=row.id, status=row.status)
        return fixed

    async def _fix(self, row: InstanceRow, now_ms: int, lost: set[str]) -> bool:
        """Publish or recover one row that has no entry; False when it needs nothing yet or
        another sweeper (or the run's executor) moved it first."""
        if row.status in (Status.PENDING, Status.DISPATCHED):
            return await self._publish(row, now_ms)
        if row.status is Status.TIMEOUT:
            return (await self._recovery.leave_timeout(row, now_ms=now_ms)).ok
        if row.lease_expires_at_ms is not None and row.lease_expires_at_ms <= now_ms:
            reason = LEASE_EXPIRED
        elif row.lease_owner in lost:
            reason = OWNER_LOST
        else:
            return False
        return (await self._recovery.time_out(row, reason=reason, now_ms=now_ms)).ok

    async def _lost_owners(
        self, rows: list[InstanceRow], live: set[str], now_ms: int, trusted: bool
    ) -> set[str]:
        """The owners of this pass's entry-less RUNNING rows with a lease still held whose
        liveness key has stayed absent for a TTL."""
        owners = {
            r.lease_owner
            for r in rows
            if r.status is Status.RUNNING
            and r.id not in live
            and r.lease_owner is not None
            and (r.lease_expires_at_ms is None or r.lease_expires_at_ms > now_ms)
        }
        if not trusted or not owners:
            self._absent_since = {}
            return set()
        alive = await admin.alive(self._redis, self._keys, owners)
        self._absent_since, lost = owners_lost(
            self._absent_since, alive, now_ms=now_ms, ttl_ms=self._ttl_ms
        )
        return lost

    async def _publish(self, row: InstanceRow, now_ms: int) -> bool:
        """Publish a lost row's entry again. A row no entry can be made of (a value the stream
        protocol refuses) is logged by the outbox and left where it is: it must not stop the
        whole pass."""
        return await self._outbox.publish(row, now_ms=now_ms) is None
