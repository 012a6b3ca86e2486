"""Entries that name an agent no module of this executor registers: poison.

The instance is failed (DISPATCHED -> FAILED `poison`, history reason `unknown_agent`) and the
entry dead-lettered. A row still PENDING/RETRYING (the outbox's CAS to DISPATCHED has not
landed yet) moves on to DISPATCHED first, as a claim would: else it would stay in flight, and
be published and dead-lettered again. An entry whose instance moved on without it (settled:
the first entry was dead-lettered, or ran; claimed by a consumer that knows the agent through a
second entry; past this attempt) is a duplicate delivery: acked, so one instance has at most
one dead letter and none beside a run that goes on.

One exception: an entry whose own move to FAILED landed and whose letter was not written: the
move's answer was lost (the store failed after its COMMIT), or the letter's XADD failed (Redis).
The entry is admitted again, its move finds the row FAILED, and the entry is that move's letter.
Until an entry's letter or ack is written, the consumer remembers what its move answered:
landed (a letter owed), or the instance moved on without it (an ack owed); with no answer, the
history tells whether the FAILED is a move of this consumer's at the entry's attempt. Either
way, a move that a manual requeue has taken back since owes no letter: that entry is acked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from taskstream.core import streams
from taskstream.core.outbox import seen_on_stream
from taskstream.core.protocol import WorkEntry
from taskstream.core.states import FailClass, Status, life_began
from taskstream.core.store.port import CasResult, Store
from taskstream.core.store.records import made_move

UNKNOWN_AGENT: Final = "unknown_agent"
OWED_KEPT: Final = 1024
"""Entries whose letter or ack is owed that are remembered, the oldest forgotten first (a
bound: an entry the sweeper took meanwhile is never admitted here again)."""

Ack = Callable[[streams.Delivery, str, Status | None], Awaitable[None]]
DeadLetter = Callable[[streams.Delivery, str, str], Awaitable[None]]


class Strangers:
    """Fails the instances of unknown agents, for one consumer."""

    def __init__(self, store: Store, consumer: str, *, ack: Ack, dead: DeadLetter) -> None:
        self._store, self._consumer = store, consumer
        self._ack, self._dead = ack, dead
        self._owed: dict[str, bool | None] = {}
        """Entry ids whose move to FAILED was sent and whose letter or ack is not written yet
        (insertion-ordered): True once a move answered that it landed, False once one answered
        that the instance moved on without it, None while no answer said either."""

    async def fail(self, delivery: streams.Delivery, entry: WorkEntry) -> None:
        """Fail the entry's instance as poison and dead-letter the entry (module docstring)."""
        moved = await self._move(delivery, entry)
        if not moved.ok and moved.found in (Status.PENDING, Status.RETRYING):
            await seen_on_stream(self._store, entry.instance_id, moved.found, entry.attempt)
            moved = await self._move(delivery, entry)
        if not moved.ok and moved.found is not None:
            await self._ack(delivery, entry.instance_id, moved.found)
        else:
            await self._dead(delivery, UNKNOWN_AGENT, entry.agent)
        # Forgotten only now: a letter or ack that failed is owed on the entry's next
        # admission, whose move finds the row FAILED whichever move it was.
        self._owed.pop(delivery.entry_id, None)

    async def _move(self, delivery: streams.Delivery, entry: WorkEntry) -> CasResult:
        key = delivery.entry_id
        sent_before, landed = key in self._owed, self._owed.get(key)
        self._remember(key, landed)
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
        if not moved.ok and moved.found is Status.FAILED and sent_before:
            landed = landed is not False and await self._landed(entry, answered=landed)
            self._remember(key, landed)
            return CasResult(ok=True) if landed else moved
        if moved.ok or moved.found not in (Status.PENDING, Status.RETRYING):
            # Not yet DISPATCHED is no answer: the move after `seen_on_stream` may land.
            self._remember(key, moved.ok)
        return moved

    async def _landed(self, entry: WorkEntry, *, answered: bool | None) -> bool:
        """Whether the row's FAILED is this consumer's move for the entry, in the instance's
        current life: as the move answered (`answered`), else as the history shows (a move
        of this consumer's at the entry's attempt). A move a manual requeue has taken back
        since owes no letter: the entry is acked, as every entry from before a requeue is."""
        history = await self._store.history(entry.instance_id)
        if life_began((h.reason, h.attempt) for h in history) > entry.attempt:
            return False
        if answered is not None:
            return answered
        return made_move(
            history,
            Status.FAILED,
            attempt=entry.attempt,
            owner=self._consumer,
            reason=UNKNOWN_AGENT,
        )

    def _remember(self, entry_id: str, landed: bool | None) -> None:
        self._owed[entry_id] = landed
        while len(self._owed) > OWED_KEPT:
            del self._owed[next(iter(self._owed))]
