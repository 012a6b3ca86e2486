"""Entries whose instance's row cannot be read: it holds what taskstream never writes (JSON
that does not parse, a status or failure class no state has: a hand edit in SQL), so no run
can be made of it. Such an entry is poison: the intake or the sweeper that reads it
dead-letters it with reason `CORRUPT_ROW` and the `StoreCorrupt` text naming the row and
column, instead of stopping on it, and goes on with the other entries.

The row is moved to FAILED `poison` (history reason `CORRUPT_ROW`) only when that move keeps
all it holds: the bad value is JSON in `payload`, `result` or `context`, which the
compare-and-set on (id, status, attempt) neither reads nor writes, and the row is DISPATCHED
at the entry's attempt (PENDING/RETRYING moves on to DISPATCHED first, as a claim would). A
status no state has cannot be moved from, and a move would overwrite a bad failure class: such
a row is left as it is, for a person to mend in SQL.
"""

from __future__ import annotations

from typing import Final

from structlog.typing import FilteringBoundLogger

from taskstream.core.errors import StoreCorrupt
from taskstream.core.outbox import seen_on_stream
from taskstream.core.protocol import WorkEntry
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, Store

CORRUPT_ROW: Final = "corrupt_row"
"""The dead-letter and history reason of an entry whose row cannot be read."""
MOVABLE: Final = frozenset({"payload", "result", "context"})
"""Columns whose bad content a move to FAILED leaves untouched."""


async def set_aside(
    store: Store,
    log: FilteringBoundLogger,
    entry: WorkEntry,
    corrupt: StoreCorrupt,
    *,
    owner: str | None = None,
) -> bool:
    """Fail the entry's instance as poison when its row allows (module docstring) and log
    `instance.unreadable`; True when the move landed. The caller dead-letters the entry."""
    failed = corrupt.column in MOVABLE and await _fail(store, entry, str(corrupt), owner)
    log.error(
        "instance.unreadable",
        instance_id=entry.instance_id,
        attempt=entry.attempt,
        failed=failed,
        error=str(corrupt)[:300],
    )
    return failed


async def _fail(store: Store, entry: WorkEntry, error: str, owner: str | None) -> bool:
    moved = await _move(store, entry, error, owner)
    if not moved.ok and moved.found in (Status.PENDING, Status.RETRYING):
        await seen_on_stream(store, entry.instance_id, moved.found, entry.attempt)
        moved = await _move(store, entry, error, owner)
    return moved.ok


async def _move(store: Store, entry: WorkEntry, error: str, owner: str | None) -> CasResult:
    return await store.transition(
        entry.instance_id,
        Status.DISPATCHED,
        Status.FAILED,
        reason=CORRUPT_ROW,
        attempt=entry.attempt,
        owner=owner,
        fail_class=FailClass.POISON,
        error=error,
    )
