"""Which stream entries an executor offers to intake next, never more than its free slots.

In order: the batch whose intake failed (the store or Redis did not answer), as far as it is
still pending for this consumer, so an outage delays it by the outage and not by the
sweeper's unclaimed timeout; after a Redis error, this consumer's own pending entries that no
run holds (a read's reply may have been lost after Redis delivered them); else new entries,
never more than the free slots (a surplus a blocking read returned goes back to its stream;
when Redis denies that move, it is offered from our own pending list as slots free up).

A work stream whose key holds another type of value (`WrongType`) is left out of the reads,
for `denials.pause_s` after each try that meets it, while the others are read as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.denials import Holds, log_denied
from taskstream.core.errors import CommandDenied, WrongType
from taskstream.core.protocol import Keys, Priority, read_order

Entry = tuple[str, str]
"""(stream, entry id)."""


class Reader:
    """One per executor process. `held` returns the entries its runs hold now."""

    def __init__(
        self,
        redis: streams.Redis,
        keys: Keys,
        consumer: str,
        block_ms: int,
        held: Callable[[], set[Entry]],
        log: FilteringBoundLogger,
        alive_ttl_ms: int,
        now_ms: Callable[[], int],
    ) -> None:
        """`alive_ttl_ms`: the liveness key's TTL, set again with every read of new entries;
        `now_ms`: the executor's clock (epoch ms), for the pauses of `hold`."""
        self._redis, self._keys, self._consumer = redis, keys, consumer
        self._block_ms, self._held, self._log = block_ms, held, log
        self._alive_ttl_ms = alive_ttl_ms
        self.unadmitted: list[streams.Delivery] = []
        """Entries read but not yet admitted: the batch whose intake failed."""
        self._recheck = False
        """Our own pending list is read before anything new (see the module doc)."""
        self._offered: set[Entry] = set()
        """Own pending entries this recheck has offered to intake: intake may leave some (a
        duplicate of a run another consumer holds), and they are not offered again."""
        self._turn = 0
        self._now_ms = now_ms
        self._wrong = Holds()
        """Streams whose key held another type at the last try, by key."""

    async def next(self, free: int) -> list[streams.Delivery]:
        """Up to `free` entries to admit; they stay `unadmitted` until `admitted`."""
        self.unadmitted = await self._batch(free)
        return self.unadmitted

    def admitted(self) -> None:
        """Intake took the last batch (or a group made anew has no pending entries)."""
        self.unadmitted = []

    def redis_failed(self) -> None:
        """A Redis call failed: a read may have delivered entries whose reply was lost."""
        self._recheck = True

    async def _batch(self, free: int) -> list[streams.Delivery]:
        if self.unadmitted:  # a dead letter or ack of the failed try is not moved twice
            return await streams.touch(self._redis, self._consumer, self.unadmitted)
        if self._recheck:
            return await self._unseen(free)
        self._turn += 1
        order = self._open(read_order(self._turn))
        if not order:  # every stream held: wait as long as a read would
            await asyncio.sleep(self._block_ms / 1000)
            return []
        try:
            read = await streams.read(
                self._redis,
                self._keys,
                self._consumer,
                count=free,
                block_ms=self._block_ms,
                order=order,
                alive_ttl_ms=self._alive_ttl_ms,
            )
        except WrongType as exc:
            self.hold(exc)
            return []
        for priority in order:
            self._wrong.clear(self._keys.stream(priority))
        try:
            for surplus in read[free:]:
                # A blocking read woke on several streams: the surplus goes back to the tail
                # of its stream at once (a move: no delivery counted), for whichever consumer
                # has a slot. Left in our pending list it would wait untouched by the
                # heartbeat, and the sweeper would take it for a delivery never claimed, or a
                # stop would leave it.
                await streams.move(self._redis, surplus, surplus.stream, surplus.fields)
        except CommandDenied as exc:
            # Those not moved stay ours: offered from our pending list as slots free up.
            log_denied(self._log, exc, left_for="recheck")
            self._recheck = True
        return read[:free]

    def hold(self, exc: WrongType) -> None:
        """Leave the stream `exc` names out of the reads for its pause (longer at each try
        in a row that meets it); logged as `redis.wrong_type`."""
        wait_s = self._wrong.hold(exc.key, self._now_ms())
        log_denied(self._log, exc, retry_in_s=wait_s)

    def _open(self, order: tuple[Priority, ...]) -> tuple[Priority, ...]:
        """The priorities of `order` whose stream is not held (`hold`)."""
        now_ms = self._now_ms()
        return tuple(p for p in order if self._wrong.due(self._keys.stream(p), now_ms))

    async def _unseen(self, free: int) -> list[streams.Delivery]:
        """Our pending entries that no run of ours holds, at most `free` of them (the oldest
        not yet offered); the rest wait for the next step. The recheck ends once none is left,
        even when intake left some in the list."""
        held = self._held()
        own = await admin.read_own(
            self._redis, self._keys, self._consumer, count=len(held) + len(self._offered) + free + 1
        )
        seen = held | self._offered
        unseen = [d for d in own if (d.stream, d.entry_id) not in seen]
        taken = unseen[:free]
        self._recheck = len(unseen) > free
        self._offered = self._offered | {(d.stream, d.entry_id) for d in taken}
        if not self._recheck:
            self._offered = set()
        if taken:
            self._log.warning("executor.unseen_entries", count=len(taken))
        return taken
