"""One run's access to its upstreams during the run (DESIGN.md §8): the `UpstreamAccess` its
agent's HTTP client asks, over the executor process's `UpstreamGate`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from taskstream.agents.upstream_access import CallTicket
from taskstream.ratelimit.breaker import Outcome

if TYPE_CHECKING:
    from taskstream.executor.admission import UpstreamGate


class RunUpstreams:
    """One run's `UpstreamAccess` (what its `UpstreamClient` asks), over the process's gate.

    The run was admitted once per declared upstream before its agent started; the client's
    first call to each of those uses that admission, later calls are admitted anew. Each
    admitted call holds a `CallTicket` with what its admission took (its half-open probe, its
    window hit), and its report is made with that ticket: a run's calls to one upstream may
    overlap, and one call's outcome must not be taken for another's probe. After the run,
    `settle` records the run's outcome for exactly the admissions no call reported on:
    declared upstreams the client never called, and calls cut short by cancellation. So each
    admitted call is recorded in its breaker once.
    """

    def __init__(
        self,
        gate: UpstreamGate,
        admitted: Sequence[str],
        hits: Mapping[str, str],
        probes: Mapping[str, int] | None = None,
    ) -> None:
        """`hits`: the window hits of the admissions in `admitted`, by upstream; `probes`:
        the rounds of those of them admitted as half-open probes, by upstream."""
        self._gate = gate
        rounds = probes or {}
        self._spare = {
            name: CallTicket(name, rounds.get(name), hits.get(name)) for name in admitted
        }
        """The run's own admissions no call has used yet, by upstream."""
        self._open: list[CallTicket] = []
        """Tickets of admitted calls not reported yet, in admission order."""

    async def acquire(self, name: str) -> CallTicket | int:
        """Admit one call to `name` (the run's spare admission first, if it still holds, see
        `UpstreamGate.refresh`): its ticket, or a wait (ms)."""
        spare = self._spare.pop(name, None)
        if spare is not None:
            ticket = await self._gate.refresh(spare)
        else:
            wait_ms, hit, probe_round = await self._gate.admit_call(name)
            ticket = wait_ms if wait_ms is not None else CallTicket(name, probe_round, hit)
        if isinstance(ticket, CallTicket):
            self._open.append(ticket)
        return ticket

    async def sending(self, ticket: CallTicket) -> bool:
        """The call of `ticket` is being sent now: move its window hit to now. False when
        that hit is stale: the call must not go out."""
        if ticket.hit is None:
            return True
        return await self._gate.restamp(ticket.upstream, ticket.hit)

    async def record(
        self, ticket: CallTicket, outcome: Outcome, *, sent: bool = True
    ) -> int | None:
        """Record the outcome of the call of `ticket` in its upstream's breaker, with the
        probe it was admitted as (if any); for a failure that leaves the breaker open, the
        cool-down left (ms) to defer the run by (see `UpstreamGate.record_call`). A ticket
        already reported (or settled) is not recorded again. A call that was not `sent` (no
        connection was made) gives its window slot back: the upstream saw no request. Its
        outcome still counts in the breaker, whose probe it was."""
        if not any(ticket is held for held in self._open):
            return None
        self._open = [held for held in self._open if held is not ticket]
        try:
            return await self._report(ticket, outcome)
        finally:
            if not sent and ticket.hit is not None:
                await self._gate.give_back([CallTicket(ticket.upstream, hit=ticket.hit)])

    async def _report(self, ticket: CallTicket, outcome: Outcome) -> int | None:
        return await self._gate.record_call(
            ticket.upstream, outcome, probe_round=ticket.probe_round
        )

    async def withdraw(self) -> None:
        """The run's agent will not be called: give back the run's own admissions whole,
        their half-open probes and their window slots, since no call goes out on them.

        Only before the agent runs: after it, an admission no call reported on may stand for
        a call the agent made with HTTP code of its own, so `settle` keeps its slot."""
        spare, self._spare = list(self._spare.values()), {}
        await self._gate.give_back(spare)

    @property
    def unsettled(self) -> bool:
        """Some admission has not been reported on yet: `settle` has work to do."""
        return bool(self._spare or self._open)

    async def settle(self, outcome: Outcome) -> int | None:
        """After the run: record `outcome` for the admissions that no call has reported on.
        When such a failure leaves a breaker open, the longest cool-down left (ms): the run
        is then deferred like a failed call through the client (see `record_call`)."""
        unreported = [*self._spare.values(), *self._open]
        self._spare, self._open = {}, []
        waits = [await self._report(ticket, outcome) for ticket in unreported]
        return max((w for w in waits if w is not None), default=None)
