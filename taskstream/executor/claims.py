"""The claims of one admission until they become runs.

A stop cancels the step under way once it has had `STEP_END_S` to end (`core.futures`). When
that step is an admission whose claim has committed (the claim's reply came late, or a read
after it did), the claimed rows hold this executor's lease at a new attempt that no run uses.
They are recorded here as they are won, so the executor hands them back (RETRYING, due now,
not counted) as it does the runs it stops, instead of leaving them for the sweeper to time
out, which spends an attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from taskstream.core.futures import mark_retrieved
from taskstream.core.store.port import Claimed

C = TypeVar("C")


class WonClaims(Generic[C]):
    """The batch being admitted (its candidates, of type `C`) and the claims won for it."""

    def __init__(self, instance_of: Callable[[C], str]) -> None:
        """`instance_of(candidate)` is the id of the instance a candidate claims."""
        self.batch: list[C] = []
        self.won: dict[str, Claimed] = {}
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

    async def call(self, claim: Awaitable[dict[str, Claimed]]) -> dict[str, Claimed]:
        """`claim`'s result. The claim runs to its end even when the admission awaiting it is
        cancelled, and what it won is recorded either way."""
        task = asyncio.ensure_future(claim)
        self._calls.add(task)
        # Added before the shield's own callback, so the claims are recorded before the
        # admission resumes.
        task.add_done_callback(self._landed)
        return await asyncio.shield(task)

    def done(self) -> None:
        """The batch's claims are runs now: nothing to hand back."""
        self.batch, self.won = [], {}

    async def unstarted(self, wait_s: float) -> tuple[list[C], dict[str, Claimed]]:
        """The batch and claims of an admission that ended without `done`, after giving a
        claim still under way `wait_s` seconds to land; empties the record. A claim landing
        later is left to the sweeper, as a crashed executor's would be."""
        if self._calls:
            await asyncio.wait(set(self._calls), timeout=wait_s)
        batch, won = self.batch, self.won
        self.done()
        return batch, won

    def _landed(self, task: asyncio.Future[dict[str, Claimed]]) -> None:
        self._calls.discard(task)
        mark_retrieved(task)
        if not task.cancelled() and task.exception() is None:
            self.won.update(task.result())
