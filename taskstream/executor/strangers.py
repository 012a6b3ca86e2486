"""Entries that name an agent no module of this executor registers: poison.

The instance is failed (DISPATCHED -> FAILED `poison`, history reason `unknown_agent`) and the
entry dead-lettered. A row still PENDING/RETRYING (the outbox's CAS to DISPATCHED has not
landed yet) moves on to DISPATCHED first, as a claim would: else it would stay in flight, and
be published and dead-lettered again. An entry whose instance moved on without it (settled:
the first entry was dead-lettered, or ran; claimed by a consumer that knows the agent through a
second entry; past this attempt) is a duplicate delivery: acked, so one instance has at most
one dead letter and none beside a run that goes on.

One exception: this consumer's own move to FAILED whose answer was lost (the store failed
after its COMMIT). The entry is admitted again, its move finds the row FAILED, and the history
shows the move was this consumer's at this attempt: the entry is that move's letter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from taskstream.core import streams
from taskstream.core.outbox import seen_on_stream
from taskstream.core.protocol import WorkEntry
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, Store

UNKNOWN_AGENT: Final = "unknown_agent"
UNANSWERED_KEPT: Final = 1024
"""Entries whose move went unanswered that are remembered, newest first (a bound: an entry
the sweeper took meanwhile is never admitted here again)."""

Ack = Callable[[streams.Delivery, str, Status | None], Awaitable[None]]
DeadLetter = Callable[[streams.Delivery, str, str], Awaitable[None]]


class Strangers:
    """Fails the instances of unknown agents, for one consumer."""

    def __init__(self, store: Store, consumer: str, *, ack: Ack, dead: DeadLetter) -> None:
        self._store, self._consumer = store, consumer
        self._ack, self._dead = ack, dead
        self._unanswered: dict[str, None] = {}
        """Entry ids whose move to FAILED was sent and not answered (an ordered set)."""

    async def fail(self, delivery: streams.Delivery, entry: WorkEntry) -> None:
        """Fail the entry's instance as poison and dead-letter the entry (module docstring)."""
        moved = await self._move(delivery, entry)
        if not moved.ok and moved.found in (Status.PENDING, Status.RETRYING):
            await seen_on_stream(self._store, entry.instance_id, moved.found, entry.attempt)
            moved = await self._move(delivery, entry)
        if not moved.ok and moved.found is not None:
            await self._ack(delivery, entry.instance_id, moved.found)
            return
        await self._dead(delivery, UNKNOWN_AGENT, entry.agent)

    async def _move(self, delivery: streams.Delivery, entry: WorkEntry) -> CasResult:
        asked_before = delivery.entry_id in self._unanswered
        self._remember(delivery.entry_id)
        moved = await self._store.transition(
            entry.instance_id,
            Status.DISPATCHED,
            Status.FAILED,
            reason=UNKNOWN_AGENT,
            attempt=entry.attempt,
            owner=self._consumer,
            fail_class=FailClass.POISON,
            error=f"unknown agent {entry.agent!r}",
        )
        self._unanswered.pop(delivery.entry_id, None)
        if not moved.ok and asked_before and moved.found is Status.FAILED:
            return CasResult(ok=await self._landed(entry))
        return moved

    async def _landed(self, entry: WorkEntry) -> bool:
        """Whether the row's move to FAILED is this consumer's own, at the entry's attempt."""
        return any(
            h.to_status is Status.FAILED
            and h.reason == UNKNOWN_AGENT
            and h.attempt == entry.attempt
            and h.owner == self._consumer
            for h in await self._store.history(entry.instance_id)
        )

    def _remember(self, entry_id: str) -> None:
        self._unanswered[entry_id] = None
        while len(self._unanswered) > UNANSWERED_KEPT:
            del self._unanswered[next(iter(self._unanswered))]
