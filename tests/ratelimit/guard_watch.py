"""What the guard walk (`guard_walk`) expects of one limiter and one breaker, written from the
rules in `taskstream.ratelimit.window` and `breaker` as their docs state them, not from their
code: the walk checks every answer of the shared backends against these.

All times are the walk's clock, UTC epoch ms.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from taskstream.ratelimit.breaker import BreakerDecision, BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.window import Limits


class Broken(AssertionError):
    """A backend answered what the rules do not allow."""


def expect(ok: bool, why: str) -> None:
    if not ok:
        raise Broken(why)


@dataclass
class WindowWatch:
    """One upstream's calls: `stamps` holds, by member, when each admitted call counts from
    (its admission, or when it was re-stamped); released hits and stale ones (never sent)
    leave it. Hits that have left the horizon stay, so `check` covers the whole walk."""

    limits: Limits
    stamps: dict[str, int] = field(default_factory=dict)

    def _count(self, low_ms: int, high_ms: int) -> int:
        """Stamps in `(low_ms, high_ms]`."""
        return sum(1 for t in self.stamps.values() if low_ms < t <= high_ms)

    def in_window(self, now_ms: int) -> int:
        return self._count(now_ms - self.limits.window_ms, now_ms)

    def in_horizon(self, now_ms: int) -> int:
        return self._count(now_ms - 2 * self.limits.window_ms, now_ms)

    def room(self, now_ms: int) -> int:
        """How many more calls may be admitted at `now_ms`: both caps of `window`."""
        limit, _, burst = self.limits
        short = limit + burst - self.in_window(now_ms)
        return max(0, min(short, 2 * limit - self.in_horizon(now_ms)))

    def admitted(self, member: str | None, now_ms: int) -> None:
        expect(member is not None and member not in self.stamps, f"hit member {member!r}")
        assert member is not None
        self.stamps[member] = now_ms

    def refused(self, retry_after_ms: int, now_ms: int) -> None:
        """A refusal at `now_ms`: the slot frees exactly `retry_after_ms` later."""
        expect(retry_after_ms >= 1, f"retry after {retry_after_ms} ms")
        expect(self.room(now_ms + retry_after_ms - 1) == 0, f"free before {retry_after_ms} ms")
        expect(self.room(now_ms + retry_after_ms) > 0, f"not free after {retry_after_ms} ms")

    def restamped(self, member: str, moved: bool, now_ms: int) -> None:
        """A hit in its window moves to now; a stale one is dropped, its call not sent."""
        at = self.stamps.get(member)
        fresh = at is not None and at > now_ms - self.limits.window_ms
        expect(moved == fresh, f"restamp of {member} at {at} said {moved} at {now_ms}")
        if moved:
            self.stamps[member] = max(now_ms, self.stamps[member])
        else:
            self.stamps.pop(member, None)

    def check(self) -> None:
        """No span of one window holds more than `limit + burst` calls, and none of two
        windows more than `2 * limit`."""
        limit, window_ms, burst = self.limits
        times = sorted(self.stamps.values())
        for i, start in enumerate(times):
            short = bisect_left(times, start + window_ms) - i
            long = bisect_left(times, start + 2 * window_ms) - i
            expect(short <= limit + burst, f"{short} calls in one window from {start}")
            expect(long <= 2 * limit, f"{long} calls in two windows from {start}")


@dataclass
class BreakerWatch:
    """One breaker's status and probes, as the state machine allows them.

    `out`: the probes of the current half-open round not reported yet (ticket ids);
    `successes`: probe successes since it half-opened; `consecutive`: counted failures in a
    row while closed. A closed breaker may also open on its failure rate, which this does
    not follow (the walk checks those against the pure rules)."""

    cfg: BreakerConfig
    status: BreakerStatus = BreakerStatus.CLOSED
    since_ms: int = 0
    last_probe_ms: int = 0
    out: set[int] = field(default_factory=set)
    successes: int = 0
    consecutive: int = 0

    def admitted(self, decision: BreakerDecision, ticket: int, now_ms: int) -> None:
        before = self.status
        if before is BreakerStatus.CLOSED:
            expect(decision.allowed and not decision.probe, f"closed answered {decision}")
        elif before is BreakerStatus.OPEN:
            ends = self.since_ms + self.cfg.cooldown_ms
            if now_ms < ends:
                expect(not decision.allowed, f"open until {ends} admitted at {now_ms}")
                expect(decision.retry_after_ms == ends - now_ms, f"{decision} at {now_ms}")
            else:
                self._round(BreakerStatus.HALF_OPEN, now_ms, keep_successes=False)
        elif now_ms >= max(self.since_ms, self.last_probe_ms) + self.cfg.probe_timeout_ms:
            self._round(BreakerStatus.HALF_OPEN, now_ms, keep_successes=True)
        if self.status is BreakerStatus.HALF_OPEN:
            self._probe(decision, ticket, now_ms)
        expect(decision.status is self.status, f"{before} -> {decision.status}, not {self.status}")

    def _probe(self, decision: BreakerDecision, ticket: int, now_ms: int) -> None:
        free = self.cfg.probes - self.successes - len(self.out)
        expect(decision.allowed == (free > 0), f"{decision} with {free} probe slots free")
        if decision.allowed:
            expect(decision.probe_round == self.since_ms, f"{decision}: round {self.since_ms}")
            self.out.add(ticket)
            self.last_probe_ms = now_ms
        else:
            lost = max(self.since_ms, self.last_probe_ms) + self.cfg.probe_timeout_ms
            expect(decision.retry_after_ms == max(1, lost - now_ms), f"{decision} at {now_ms}")

    def _round(self, status: BreakerStatus, now_ms: int, *, keep_successes: bool) -> None:
        self.status, self.since_ms, self.out = status, now_ms, set()
        self.successes = self.successes if keep_successes else 0
        self.consecutive = 0

    def recorded(
        self, ticket: int, probe_round: int | None, outcome: Outcome, after: BreakerState
    ) -> None:
        before = self.status
        if before is BreakerStatus.OPEN:
            expect(after.status is before, f"a report moved an open breaker to {after.status}")
        elif before is BreakerStatus.HALF_OPEN:
            self._probe_report(ticket, probe_round, outcome, after)
        elif outcome is not Outcome.IGNORE:
            failed = outcome is Outcome.FAILURE
            self.consecutive = self.consecutive + 1 if failed else 0
            trips = self.consecutive >= self.cfg.failure_threshold
            expect(after.status is not BreakerStatus.HALF_OPEN, "closed -> half-open")
            expect(not trips or after.status is BreakerStatus.OPEN, "failures did not trip it")
            if after.status is BreakerStatus.OPEN:
                self._round(BreakerStatus.OPEN, after.since_ms, keep_successes=False)
        else:
            expect(after.status is before, f"an ignored outcome moved it to {after.status}")

    def _probe_report(
        self, ticket: int, probe_round: int | None, outcome: Outcome, after: BreakerState
    ) -> None:
        if ticket not in self.out:  # not a probe of this round: it decides nothing
            expect(after.status is BreakerStatus.HALF_OPEN, f"{probe_round} moved it")
            expect(after.since_ms == self.since_ms, f"{probe_round} began a round")
            return
        self.out.discard(ticket)
        if outcome is Outcome.FAILURE:
            expect(after.status is BreakerStatus.OPEN, "a probe's failure left it half-open")
            self._round(BreakerStatus.OPEN, after.since_ms, keep_successes=False)
        elif outcome is Outcome.SUCCESS:
            self.successes += 1
            closes = self.successes >= self.cfg.probes
            want = BreakerStatus.CLOSED if closes else BreakerStatus.HALF_OPEN
            expect(after.status is want, f"{self.successes} successes: {after.status}")
            if closes:
                self._round(BreakerStatus.CLOSED, after.since_ms, keep_successes=False)
        else:
            expect(after.status is BreakerStatus.HALF_OPEN, "an ignored probe moved it")

    def check(self, stored: BreakerState) -> None:
        """The stored state is where this watch is, and no more probes are out than allowed."""
        expect(stored.status is self.status, f"stored {stored.status}, expected {self.status}")
        if self.status is not BreakerStatus.CLOSED:
            expect(
                stored.since_ms == self.since_ms, f"since {stored.since_ms}, not {self.since_ms}"
            )
        expect(len(self.out) + self.successes <= self.cfg.probes, f"{len(self.out)} probes out")
