"""The outbox (DESIGN.md §6.1): INSERT PENDING -> XADD -> CAS PENDING->DISPATCHED.

A crash between the steps leaves a PENDING row; the reconciler publishes such rows again, so
no fire time is lost, and the UNIQUE dedupe key makes sure none is doubled. A failure after
the creation commit (the XADD, or the CAS) does not fail the emit: its caller learns that the
instance exists (`unpublished`, or `published` still PENDING) and records it, rather than
emitting again and finding it a duplicate.

Emits are group-committed: while one batch is being written, new emits queue and go in the
next, so many concurrent emits cost three round trips per batch (one transaction creating the
rows, one pipeline of XADDs, one transaction of CAS updates) instead of per instance; a batch's
CAS step overlaps the next batch's creation. Alone, an emit is a batch of one and waits for
nothing. A batch the store refuses for one row's value is created row by row, so that only
that row's emit fails (`outbox_creation`). The batch is written by its own task, so a
cancelled caller never interrupts it halfway (its instance may still be created; its dedupe key
makes a retry safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from taskstream.core import streams
from taskstream.core.denials import log_denied
from taskstream.core.errors import CommandDenied, WrongType
from taskstream.core.futures import mark_retrieved
from taskstream.core.logging import get_logger
from taskstream.core.outbox_creation import Outcome, create_batch
from taskstream.core.outbox_entries import new_entry, placed_entry, why_refused
from taskstream.core.protocol import Keys, Priority, WorkEntry
from taskstream.core.reasons import SEEN_ON_STREAM
from taskstream.core.states import Status
from taskstream.core.store.port import (
    CreateResult,
    DispatchRequest,
    InstanceRow,
    NewInstance,
    Store,
)
from taskstream.core.told import Told
from taskstream.core.wrong_types import publish_each

EmitOutcome = Literal["published", "duplicate", "unpublished", "fenced"]
"""`unpublished`: the instance was created (PENDING) but its entry could not be added to a
stream (Redis failed); the reconciler publishes it once it is older than its grace.
`fenced`: nothing was written, a scheduler newer than the emitting one leads its task."""
MAX_BATCH = 200
"""Instances per group-committed batch (one chunk of the store's batch statements)."""


@dataclass(frozen=True, slots=True)
class Emitted:
    """What emitting one instance did. `instance_id` names the row that exists now.

    `status`: for `duplicate`, the existing row's status as read; for `unpublished`,
    PENDING; for `published`, DISPATCHED once the step to DISPATCHED is done, by this outbox's
    CAS or by another writer first (mostly an executor that read the entry and claimed the
    row, which may then be RUNNING or further on already), else PENDING (that step failed:
    the row moves on when an executor reads its entry)."""

    outcome: EmitOutcome
    instance_id: str
    status: Status | None = None


@dataclass(slots=True)
class _Emit:
    new: NewInstance
    now_ms: int
    token: int | None
    done: asyncio.Future[Emitted] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Outbox:
    """Publishes instances from the store to the work streams."""

    def __init__(self, store: Store, redis: streams.Redis, keys: Keys) -> None:
        self.store, self.redis, self.keys = store, redis, keys
        self._queue: list[_Emit] = []
        self._writer: asyncio.Task[None] | None = None
        self._log = get_logger(role="outbox")
        self._told = Told()
        """Refused rows already logged, with why: the reconciler offers such a row again
        every pass, and once is enough until its reason changes."""

    async def emit(self, new: NewInstance, *, now_ms: int, token: int | None = None) -> Emitted:
        """Create the instance and publish it. A duplicate dedupe key publishes nothing, even
        when the existing row is still PENDING: its creator is publishing it right now, or
        crashed, and then the reconciler publishes it once it is older than its grace.

        Raises when the instance could not be created (nothing was written: emitting again is
        safe). Once it is created, a failed XADD does not raise: the outcome says
        `unpublished`, so the caller records the instance it made instead of trying again
        and finding it a duplicate. `token`: the emitting scheduler's leader-lease token;
        the instance is then created only while its task holds no newer token."""
        item = _Emit(new, now_ms, token)
        item.done.add_done_callback(mark_retrieved)
        self._queue.append(item)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queue())
        return await asyncio.shield(item.done)

    async def publish(self, row: InstanceRow, *, now_ms: int) -> str | None:
        """XADD the row's entry, then move it to DISPATCHED: CAS PENDING or RETRYING ->
        DISPATCHED (a DISPATCHED row whose entry was lost is only published again). Losing
        the CAS is normal: an executor that already saw the entry may have moved the row on.
        None when published, else why no entry can be made of the row (see `publish_many`)."""
        return (await self.publish_many([row], now_ms=now_ms)).get(row.id)

    async def publish_many(self, rows: Sequence[InstanceRow], *, now_ms: int) -> dict[str, str]:
        """`publish` for many rows: one pipeline of XADDs, then one batch of CAS updates per
        `MAX_BATCH` rows. A row no entry can be made of (a value the stream protocol refuses,
        such as a priority that a foreign writer put in the store) is logged
        (`instance.unpublishable`) and left as it is, so that it cannot hold back the others;
        so is a row whose stream's key holds another type (`redis.wrong_type`, see
        `errors.WrongType`). Returns those rows' ids, each with why."""
        refused: dict[str, str] = {}
        for start in range(0, len(rows), MAX_BATCH):
            part = self._entries(rows[start : start + MAX_BATCH], now_ms, refused)
            added = await publish_each(self.redis, self.keys, [entry for _, entry in part])
            placed = []
            for (row, _), result in zip(part, added, strict=True):
                if isinstance(result, WrongType):  # its stream's key is no stream: left
                    refused[row.id] = str(result)
                    self._tell(row, refused[row.id], result)
                else:
                    placed.append(row)
            waiting = (Status.PENDING, Status.RETRYING)
            await self._dispatch(
                [DispatchRequest(r.id, r.status, r.attempt) for r in placed if r.status in waiting]
            )
        return refused

    def _entries(
        self, rows: Sequence[InstanceRow], now_ms: int, refused: dict[str, str]
    ) -> list[tuple[InstanceRow, tuple[Priority, WorkEntry]]]:
        """Each row with its entry; the rows that cannot have one go to `refused`."""
        out = []
        for row in rows:
            try:
                out.append((row, placed_entry(row, now_ms)))
            except ValueError as exc:  # pydantic's ValidationError is one
                refused[row.id] = why_refused(exc)
                self._tell(row, refused[row.id])
            else:
                self._told.forget(row.id)
        return out

    def _tell(self, row: InstanceRow, why: str, wrong: WrongType | None = None) -> None:
        """Log a refused row, unless this outbox already logged it for the same reason;
        `redis.wrong_type` when its stream's key holds another type (`wrong`)."""
        if not self._told.first_time(row.id, why):
            return
        if wrong is not None:
            log_denied(self._log, wrong, instance_id=row.id, status=row.status)
        else:
            self._log.error(
                "instance.unpublishable", instance_id=row.id, status=row.status, error=why
            )

    async def _write_queue(self) -> None:
        """Write queued emits batch by batch. A batch's CAS step overlaps the next batch's
        creation (at most one CAS step in flight), which halves the wait of a queued emit."""
        cas_step: asyncio.Task[None] | None = None
        while self._queue or cas_step is not None:
            if not self._queue and cas_step is not None:
                # Emits queued while this waits are written by this loop too: `emit` starts
                # no second writer while this one is not done.
                await cas_step
                cas_step = None
                continue
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            outcomes = await create_batch(
                self.store, [item.new for item in batch], [item.token for item in batch]
            )
            batch, created = _answer_failed(batch, outcomes)
            if not batch:
                continue
            published = await self._publish_created(batch, created)
            if cas_step is not None:
                await cas_step
            cas_step = asyncio.create_task(self._settle(batch, created, published))

    async def _publish_created(
        self, batch: Sequence[_Emit], created: Sequence[CreateResult]
    ) -> bool:
        """XADD the entries of the batch's new rows; False when that failed. The rows are
        stored whatever Redis answered (down, out of memory), so they stay PENDING for the
        reconciler rather than failing their callers."""
        fresh = [item for item, c in zip(batch, created, strict=True) if c.created]
        try:
            entries = [(Priority.of(i.new.priority), new_entry(i.new, i.now_ms)) for i in fresh]
            await streams.publish_many(self.redis, self.keys, entries)
        except CommandDenied as exc:
            log_denied(
                self._log, exc, instance_ids=[i.new.id for i in fresh], left_for="reconciler"
            )
            return False
        except Exception as exc:
            self._log.warning(
                "instances.unpublished",
                count=len(fresh),
                instance_ids=[i.new.id for i in fresh],
                error_type=type(exc).__name__,
                error=str(exc)[:300],
            )
            return False
        return True

    async def _settle(
        self, batch: Sequence[_Emit], created: Sequence[CreateResult], published: bool
    ) -> None:
        """CAS the batch's new rows to DISPATCHED when their entries were added, then answer
        its callers. A failed CAS fails nobody: the rows exist and their entries are on a
        stream (an executor that reads one moves its row on from PENDING itself)."""
        fresh = [i.new.id for i, c in zip(batch, created, strict=True) if c.created]
        status = Status.PENDING
        if published and fresh:
            try:
                await self._dispatch([DispatchRequest(i, Status.PENDING, 0) for i in fresh])
                status = Status.DISPATCHED
            except Exception as exc:
                self._log.warning(
                    "instances.dispatch_failed",
                    count=len(fresh),
                    error_type=type(exc).__name__,
                    error=str(exc)[:300],
                )
        for item, c in zip(batch, created, strict=True):
            if c.fenced:
                item.done.set_result(Emitted("fenced", c.instance_id))
            elif not c.created:
                await self._answer_duplicate(item, c.instance_id)
            elif published:
                item.done.set_result(Emitted("published", c.instance_id, status))
            else:
                item.done.set_result(Emitted("unpublished", c.instance_id, Status.PENDING))

    async def _answer_duplicate(self, item: _Emit, instance_id: str) -> None:
        """A duplicate's answer names the existing row's status; its caller alone learns when
        that cannot be read."""
        try:
            row = await self.store.get_instance(instance_id)
        except Exception as exc:
            item.done.set_exception(exc)
            return
        item.done.set_result(Emitted("duplicate", instance_id, row.status if row else None))

    async def _dispatch(self, requests: list[DispatchRequest]) -> None:
        """CAS to DISPATCHED; a lost CAS is only noted, at debug: the row moved on first
        (an executor read the entry and completed this step itself, or the reconciler did),
        which is routine when executors are idle and fast."""
        if not requests:
            return
        results = await self.store.dispatch_many(requests)
        for instance_id, cas in results.items():
            if not cas.ok:
                self._log.debug(
                    "instance.dispatch_cas_lost", instance_id=instance_id, found=cas.found
                )


def _answer_failed(
    batch: Sequence[_Emit], outcomes: Sequence[Outcome]
) -> tuple[list[_Emit], list[CreateResult]]:
    """Give each emit whose creation failed its error; the others, with their results."""
    made: list[tuple[_Emit, CreateResult]] = []
    for item, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, CreateResult):
            made.append((item, outcome))
        elif not item.done.done():
            item.done.set_exception(outcome)
    return [item for item, _ in made], [result for _, result in made]


async def seen_on_stream(
    store: Store, instance_id: str, status: Status, attempt: int
) -> Status | None:
    """Complete the outbox's last step for a row at `status` (PENDING or RETRYING, at
    `attempt`) whose entry was read from a stream, so its XADD happened: CAS to DISPATCHED,
    recorded as `seen_on_stream`. Returns the row's status now: DISPATCHED when this move or
    the outbox's own landed, else the status that stopped it (None: no such row)."""
    moved = await store.transition(
        instance_id, status, Status.DISPATCHED, reason=SEEN_ON_STREAM, attempt=attempt
    )
    return Status.DISPATCHED if moved.ok else moved.found
