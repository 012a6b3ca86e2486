"""The limiter's guard band: the executors count each hit for window + guard, so calls that
reach the upstream after differing delays still respect the declared window there. Pure: the
window rule `decide`, integers of milliseconds, no clock."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.ratelimit.window import GUARD_PERCENT, Limits, decide, guard_ms, guarded


@pytest.mark.parametrize(
    ("window_ms", "want"),
    [(10_000, 200), (60_000, 1_200), (1_000, 20), (250, 5), (51, 2), (50, 1), (1, 1)],
)
def test_the_guard_is_a_fraction_of_the_window_rounded_up(window_ms: int, want: int) -> None:
    assert GUARD_PERCENT == 2
    assert guard_ms(window_ms) == want


def test_guarded_widens_only_the_window() -> None:
    assert guarded(Limits(50, 10_000, 5)) == Limits(50, 10_200, 5)


def _most_in_any_span(times: Sequence[float], span_ms: int) -> int:
    """The largest number of `times` inside any half-open span of `span_ms`."""
    ordered = sorted(times)
    return max((bisect_left(ordered, t + span_ms) - i for i, t in enumerate(ordered)), default=0)


def _admit_greedily(asks: list[int], limits: Limits) -> list[int]:
    """Admission times of calls first asked at `asks` (ms), each retrying after its wait."""
    hits: list[int] = []
    for ask in sorted(asks):
        now = ask
        while not (answer := decide(now, hits, *limits)).allowed:
            now += answer.retry_after_ms
        hits.append(now)
    return hits


def test_without_the_guard_a_slow_first_call_puts_one_too_many_in_a_window() -> None:
    """Admitted at 0, 1 and 100 (limit 2 per 100 ms), the first arriving 50 ms late: the
    upstream sees three calls in [1, 101)."""
    hits = _admit_greedily([0, 1, 2], Limits(2, 100))
    assert hits == [0, 1, 100]
    arrivals = [hits[0] + 50, hits[1], hits[2]]
    assert _most_in_any_span(arrivals, 100) == 3


@given(
    asks=st.lists(st.integers(min_value=0, max_value=3_000), min_size=1, max_size=60),
    delays=st.lists(st.floats(min_value=0.0, max_value=0.999), min_size=60, max_size=60),
    limit=st.integers(min_value=1, max_value=5),
    burst=st.integers(min_value=0, max_value=3),
    window_ms=st.integers(min_value=1, max_value=1_000),
)
def test_arrivals_keep_the_declared_window_when_delays_differ_by_less_than_the_guard(
    asks: list[int], delays: list[float], limit: int, burst: int, window_ms: int
) -> None:
    limits = Limits(limit, window_ms, burst)
    guard = guard_ms(window_ms)
    hits = _admit_greedily(asks, guarded(limits))
    # Each call arrives 0 <= d < guard ms after its admission (any common delay can be added).
    arrivals = [hit + delay * guard for hit, delay in zip(hits, delays, strict=False)]
    assert _most_in_any_span(arrivals, window_ms) <= limit + burst
