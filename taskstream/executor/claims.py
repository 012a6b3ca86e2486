"""The claims of one admission until they become runs.

A stop cancels the step under way once it has had `STEP_END_S` to end (`core.futures`). When
that step is an admission whose claim has committed (the claim's reply came late, or a read
after it did), the claimed rows hold this executor's lease at a new attempt that no run uses.
They are recorded here as they are won, so the executor hands them back (RETRYING, due now,
not counted) as it does the runs it stops, instead of leaving them for the sweeper to time
out, which spends an attempt.

A claim that failed with the store unavailable may have committed all the same (its reply was
lost with the connection). While the batch is not admitted again, its candidates are kept as
unsure claims: a stop notes them in Redis (`handover`) at the attempt they would hold, which
the sweeper takes as a release only if the row is RUNNING at that attempt under this owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Generic, TypeVar

from taskstream.core.errors import StoreUnavailable
from taskstream.core.futures import mark_retrieved
from taskstream.core.store.port import Claimed

C = TypeVar("C")


class WonClaims(Generic[C]):
    """The batch being admitted (its candidates, of type `C`), the claims won for it, and
    the candidates whose claim may have landed unseen."""

    def __init__(self, instance_of: Callable[[C], str]) -> None:
        """`instance_of(candidate)` is the id of the instance a candidate claims."""
        self.batch: list[C] = []
        self.won: dict[str, Claimed] = {}
        self.unsure: dict[str, C] = {}
        """Candidates, by instance id, of claims that failed with the store unavailable
        since the last admission that was done."""
        self._instance_of = instance_of
        self._calls: set[asyncio.Future[dict[str, Claimed]]] = set()

    def start(self, batch: list[C]) -> dict[str, Claimed]:
        """Begin recording for `batch`; returns the dict the claims of the batch go into. The
        claims of an admission that ended without `done` (it failed after winning them, and
        the store may still be away) are kept, with their candidates, until one is done."""
        kept = {self._instance_of(c): c for c in self.batch if self._instance_of(c) in self.won}
        self.won = {instance_id: self.won[instance_id] for instance_id in kept}
        self.batch = [*kept.values(), *batch]
        return self.won

    async def call(
        self, claim: Awaitable[dict[str, Claimed]], candidates: list[C]
    ) -> dict[str, Claimed]:
        """`claim`'s result (the claims of `candidates`). The claim runs to its end even when
        the admission awaiting it is cancelled, and what it won is recorded either way; when
        it fails with the store unavailable, its candidates are recorded as unsure."""
        task = asyncio.ensure_future(claim)
        self._calls.add(task)
        # Added before the shield's own callback, so the claims are recorded before the
        # admission resumes.
        task.add_done_callback(partial(self._landed, candidates))
        return await asyncio.shield(task)

    def done(self) -> None:
        """The batch's claims are runs now: nothing to hand back, nothing unsure."""
        self.batch, self.won, self.unsure = [], {}, {}

    async def unstarted(self, wait_s: float) -> tuple[list[C], dict[str, Claimed], list[C]]:
        """The batch and claims of an admission that ended without `done`, after giving a
        claim still under way `wait_s` seconds to land, and the unsure candidates that won
        nothing seen; empties the record. A claim landing later is left to the sweeper, as a
        crashed executor's would be."""
        if self._calls:
            await asyncio.wait(set(self._calls), timeout=wait_s)
        batch, won = self.batch, self.won
        unsure = [c for i, c in self.unsure.items() if i not in won]
        self.done()
        return batch, won, unsure

    def _landed(self, candidates: list[C], task: asyncio.Future[dict[str, Claimed]]) -> None:
        self._calls.discard(task)
        mark_retrieved(task)
        if task.cancelled():
            return
        if (error := task.exception()) is None:
            self.won.update(task.result())
        elif isinstance(error, StoreUnavailable):
            self.unsure.update((self._instance_of(c), c) for c in candidates)
