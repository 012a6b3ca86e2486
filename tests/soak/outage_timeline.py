"""The breaker's timeline during an outage, from what was observed (pure; no I/O, no clock).

Inputs are on one clock, the breaker's (the Redis server's, UTC epoch ms): the breaker states
a watcher saw, each with the `since_ms` its status began, and the upstream's arrival log.

An open period starts at an open state's `since_ms`. Until `since_ms + cooldown_ms` every
admission is refused, so an arrival then is a call admitted before the breaker opened and
still on its way; those are told apart by `slack_ms` (arrivals in the first `slack_ms` are
`in_flight`, later ones `while_open`, which must not exist). From the end of the cool-down
until the next closed or open state begins, only half-open probes are admitted: those
arrivals are the period's `probes`. A probe is answered before its outcome is recorded, so
it arrives before the state it causes begins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from taskstream.ratelimit.breaker import BreakerStatus
from taskstream.ratelimit.breaker_config import BreakerConfig
from tests.support.outage_upstream import DOWN, Arrival


@dataclass(frozen=True, slots=True)
class BreakerSeen:
    """One breaker state as observed: its status and when that status began (ms)."""

    status: BreakerStatus
    since_ms: int


@dataclass(frozen=True, slots=True)
class OpenPeriod:
    """One stretch from opening to closing or opening again (ms on the breaker's clock).

    `resolved_ms` is when the next closed or open state began (None: still open or half-open
    at the last observation), `closed` whether that state was closed.
    """

    opened_ms: int
    probe_from_ms: int
    resolved_ms: int | None
    closed: bool
    in_flight: tuple[Arrival, ...]
    while_open: tuple[Arrival, ...]
    probes: tuple[Arrival, ...]


def distinct(seen: Sequence[BreakerSeen]) -> list[BreakerSeen]:
    """The observations with repeats of the same state (status and start) dropped."""
    out: list[BreakerSeen] = []
    for state in seen:
        if not out or out[-1] != state:
            out.append(state)
    return out


def _between(arrivals: Sequence[Arrival], start_ms: int, end_ms: int | None) -> tuple[Arrival, ...]:
    """Arrivals at `start_ms` <= t < `end_ms` (no end: to the last one)."""
    return tuple(
        a for a in arrivals if a.at_ms >= start_ms and (end_ms is None or a.at_ms < end_ms)
    )


def _resolution(states: Sequence[BreakerSeen], after: int) -> BreakerSeen | None:
    """The first closed or open state observed after index `after`."""
    return next((s for s in states[after + 1 :] if s.status is not BreakerStatus.HALF_OPEN), None)


def open_periods(
    seen: Sequence[BreakerSeen], arrivals: Sequence[Arrival], cfg: BreakerConfig, slack_ms: int
) -> list[OpenPeriod]:
    """Every open period in the observations, oldest first, with the arrivals in each part."""
    states = distinct(seen)
    periods: list[OpenPeriod] = []
    for index, state in enumerate(states):
        if state.status is not BreakerStatus.OPEN:
            continue
        opened, probe_from = state.since_ms, state.since_ms + cfg.cooldown_ms
        until = _resolution(states, index)
        resolved = None if until is None else until.since_ms
        periods.append(
            OpenPeriod(
                opened_ms=opened,
                probe_from_ms=probe_from,
                resolved_ms=resolved,
                closed=until is not None and until.status is BreakerStatus.CLOSED,
                in_flight=_between(arrivals, opened, min(opened + slack_ms, probe_from)),
                while_open=_between(arrivals, opened + slack_ms, probe_from),
                probes=_between(arrivals, probe_from, resolved),
            )
        )
    return periods


def failed_before(arrivals: Sequence[Arrival], at_ms: int) -> int:
    """Calls answered as down that arrived before `at_ms`."""
    return sum(1 for a in arrivals if a.at_ms < at_ms and a.status == DOWN)


def shifted(arrivals: Sequence[Arrival], offset_ms: int) -> list[Arrival]:
    """The arrivals with `offset_ms` added to each time (moves them onto another clock)."""
    return [Arrival(a.at_ms + offset_ms, a.target, a.status) for a in arrivals]
