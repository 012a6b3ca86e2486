"""Entries leaving a work stream other than by ack, from the executor side (intake, committer,
sweeper): the move itself is `streams.move`'s, which takes an entry only while it is still
pending; here each move, or each move another mover made first, gets its log line."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.port import Store
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


def moved_meanwhile(log: FilteringBoundLogger, delivery: streams.Delivery) -> None:
    """Log that another mover acked or moved `delivery` after this process read it."""
    log.info("entry.moved_meanwhile", entry_id=delivery.entry_id, stream=delivery.stream)


async def owed_reason(store: Store, instance_id: str) -> str:
    """The dead-letter reason of an entry whose instance FAILED as poison before its mover
    moved it (`sweep.poison_reason` of the reason recorded with the last move to FAILED)."""
    history = await store.history(instance_id)
    failed = next((h.reason for h in reversed(history) if h.to_status is Status.FAILED), None)
    return poison_reason(failed)
