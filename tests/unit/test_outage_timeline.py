"""The breaker-outage run's timeline analysis (tests/soak/outage_timeline.py) finds what it
must: a call while open, an extra probe, in-flight calls, and a period still unresolved. Each
case is a small synthetic timeline, so an analysis that silently stopped finding anything
fails here."""

from __future__ import annotations

from taskstream.ratelimit.breaker import BreakerStatus
from taskstream.ratelimit.breaker_config import BreakerConfig
from tests.soak.outage_timeline import (
    BreakerSeen,
    distinct,
    failed_before,
    open_periods,
    shifted,
)
from tests.support.outage_upstream import DOWN, UP, Arrival

CFG = BreakerConfig(cooldown_ms=30_000, probes=1)
OPEN, HALF, CLOSED = BreakerStatus.OPEN, BreakerStatus.HALF_OPEN, BreakerStatus.CLOSED
T = 1_000_000
SLACK = 1_000


def down(at_ms: int) -> Arrival:
    return Arrival(at_ms, "/x", DOWN)


def up(at_ms: int) -> Arrival:
    return Arrival(at_ms, "/x", UP)


SEEN = [
    BreakerSeen(CLOSED, 0),
    BreakerSeen(OPEN, T),
    BreakerSeen(OPEN, T),
    BreakerSeen(HALF, T + 30_500),
    BreakerSeen(OPEN, T + 30_600),
    BreakerSeen(CLOSED, T + 60_700),
]


def test_repeated_observations_collapse() -> None:
    assert distinct(SEEN) == [SEEN[0], SEEN[1], *SEEN[3:]]


def test_a_clean_outage_has_probes_only() -> None:
    arrivals = [down(T - 300), down(T - 10), down(T + 30_550), up(T + 60_650), up(T + 61_000)]
    first, second = open_periods(SEEN, arrivals, CFG, SLACK)
    assert (first.opened_ms, first.probe_from_ms, first.resolved_ms) == (T, T + 30_000, T + 30_600)
    assert (first.closed, first.probes, first.while_open) == (False, (down(T + 30_550),), ())
    assert (second.opened_ms, second.resolved_ms, second.closed) == (T + 30_600, T + 60_700, True)
    assert second.probes == (up(T + 60_650),)
    assert failed_before(arrivals, T) == 2


def test_calls_while_open_and_extra_probes_are_found() -> None:
    arrivals = [down(T + 200), down(T + 5_000), down(T + 30_510), down(T + 30_520)]
    first, _ = open_periods(SEEN, arrivals, CFG, SLACK)
    assert first.in_flight == (down(T + 200),)
    assert first.while_open == (down(T + 5_000),)
    assert len(first.probes) == 2


def test_a_period_never_resolved_has_no_end() -> None:
    [period] = open_periods([BreakerSeen(OPEN, T)], [down(T + 40_000)], CFG, SLACK)
    assert (period.resolved_ms, period.closed, period.probes) == (None, False, (down(T + 40_000),))


def test_shifting_moves_arrivals_onto_another_clock() -> None:
    assert shifted([up(T)], -5) == [up(T - 5)]
