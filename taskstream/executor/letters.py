"""Entries leaving a work stream other than by ack, from the executor side (intake, committer,
sweeper): the move itself is `streams.move`'s, which takes an entry only while it is still
pending; here each move, or each move another mover made first, gets its log line."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from taskstream.core import streams
from taskstream.core.denials import log_denied
from taskstream.core.errors import CommandDenied
from taskstream.core.protocol import Keys
from taskstream.core.states import failed_as_poison, last_failure, life_began, poisoned_by
from taskstream.core.store.port import InstanceRow, Store
from taskstream.executor.sweep import poison_reason


async def dead_letter(
    redis: streams.Redis,
    keys: Keys,
    log: FilteringBoundLogger,
    delivery: streams.Delivery,
    reason: str,
    detail: str,
) -> bool:
    """Move `delivery` to the dead-letter stream with its reason; False when another mover
    (a second sweeper, the entry's executor) acked or moved it first."""
    dead_id = await streams.dead_letter(redis, keys, delivery, reason, detail)
    if dead_id is None:
        moved_meanwhile(log, delivery)
        return False
    log.warning(
        "entry.dead_lettered",
        entry_id=delivery.entry_id,
        stream=delivery.stream,
        reason=reason,
        dead_id=dead_id,
    )
    return True


def left_pending(log: FilteringBoundLogger, delivery: streams.Delivery, exc: CommandDenied) -> None:
    """Log that Redis denied the ack or move of `delivery`, left pending as it is for the
    sweeper, which takes it once idle and tries again (pausing while it is denied)."""
    log_denied(log, exc, entry_id=delivery.entry_id, stream=delivery.stream, left_for="sweeper")


def moved_meanwhile(log: FilteringBoundLogger, delivery: streams.Delivery) -> None:
    """Log that another mover acked or moved `delivery` after this process read it."""
    log.info("entry.moved_meanwhile", entry_id=delivery.entry_id, stream=delivery.stream)


async def owed_letter(store: Store, entry_attempt: int, row: InstanceRow) -> str | None:
    """The dead-letter reason an entry of `entry_attempt` still owes when `row` FAILED as
    poison by it (`states.poisoned_by`) and its mover failed before moving it; None when it
    owes none: the row did not fail as poison (no history is read then), or not by this
    entry (another attempt, or a later life: the attempt a requeue made is no run of an
    entry from before it)."""
    if not failed_as_poison(row.status, row.fail_class):
        return None
    history = await store.history(row.id)
    began = life_began((h.reason, h.attempt) for h in history)
    if not poisoned_by(entry_attempt, row.status, row.fail_class, row.attempt, life_began=began):
        return None
    return poison_reason(last_failure((h.to_status, h.reason) for h in history))
