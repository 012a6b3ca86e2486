"""The pure sliding-window rules: tables of hits and times, plus properties over simulated
sequences of calls. No clock and no Redis: every time is an integer of milliseconds."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.errors import ConfigError
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.ratelimit.window import Admission, Limits, decide, limits_from_spec, restamped


def _yes(in_window: int) -> Admission:
    return Admission(allowed=True, retry_after_ms=0, in_window=in_window)


def _no(retry_after_ms: int, in_window: int) -> Admission:
    return Admission(allowed=False, retry_after_ms=retry_after_ms, in_window=in_window)


@pytest.mark.parametrize(
    ("hits", "now_ms", "limits", "want"),
    [
        pytest.param([], 0, Limits(1, 100), _yes(1), id="first-call"),
        pytest.param([0, 10], 20, Limits(3, 100), _yes(3), id="room-left"),
        pytest.param([0, 10, 20], 30, Limits(3, 100), _no(70, 3), id="full-wait-for-oldest"),
        pytest.param([20, 0, 10], 30, Limits(3, 100), _no(70, 3), id="hits-in-any-order"),
        pytest.param([0, 10, 20], 99, Limits(3, 100), _no(1, 3), id="oldest-leaves-in-1ms"),
        pytest.param([0, 10, 20], 100, Limits(3, 100), _yes(3), id="oldest-just-left"),
        pytest.param([5, 5, 5], 5, Limits(3, 100), _no(100, 3), id="same-ms-hits-each-count"),
        pytest.param([-500, -300], 0, Limits(1, 100), _yes(1), id="beyond-horizon-ignored"),
        pytest.param([0, 1], 2, Limits(2, 100, 1), _yes(3), id="burst-above-limit"),
        pytest.param([0, 1, 2], 3, Limits(2, 100, 1), _no(97, 3), id="burst-used-up"),
        pytest.param([0, 1, 2], 100, Limits(2, 100, 1), _yes(3), id="next-window-has-room"),
        pytest.param([0, 1, 2, 100], 101, Limits(2, 100, 1), _no(99, 2), id="burst-paid-back"),
        pytest.param([0, 1, 2, 100], 200, Limits(2, 100, 1), _yes(1), id="paid-back-done"),
        pytest.param([0, 50], 60, Limits(1, 100, 5), _no(140, 2), id="long-cap-binds-first"),
    ],
)
def test_decision_table(hits: list[int], now_ms: int, limits: Limits, want: Admission) -> None:
    assert decide(now_ms, hits, *limits) == want


@pytest.mark.parametrize(
    ("limit", "window_ms", "burst", "problems"),
    [(0, 100, 0, 1), (1, 0, 0, 1), (1, 100, -1, 1), (0, 0, -1, 3)],
)
def test_out_of_range_limits_name_every_problem(
    limit: int, window_ms: int, burst: int, problems: int
) -> None:
    with pytest.raises(ConfigError) as raised:
        decide(0, [], limit, window_ms, burst)
    assert len(raised.value.problems) == problems


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"limit": 5, "window": "1m"}, Limits(5, 60_000, 0)),
        ({"limit": 2, "window": 0.25, "burst": 3}, Limits(2, 250, 3)),
        ({"limit": 1, "window": "0.001s"}, Limits(1, 1, 0)),
    ],
)
def test_limits_from_a_task_spec(spec: dict[str, object], want: Limits) -> None:
    assert limits_from_spec(UpstreamLimit.model_validate(spec)) == want


def _most_in_any_span(hits: list[int], span_ms: int) -> int:
    """The largest number of `hits` (sorted) inside any half-open span of `span_ms`."""
    return max((bisect_left(hits, h + span_ms) - i for i, h in enumerate(hits)), default=0)


calls = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=150)


@given(
    gaps=calls,
    limit=st.integers(min_value=1, max_value=6),
    burst=st.integers(min_value=0, max_value=6),
    window_ms=st.integers(min_value=1, max_value=300),
)
def test_no_span_ever_admits_more_than_the_caps(
    gaps: list[int], limit: int, burst: int, window_ms: int
) -> None:
    now, hits = 0, list[int]()
    for gap in gaps:
        now += gap
        if decide(now, hits, limit, window_ms, burst).allowed:
            hits.append(now)
    assert _most_in_any_span(hits, window_ms) <= limit + burst
    assert _most_in_any_span(hits, 2 * window_ms) <= 2 * limit


@given(
    gaps=calls,
    limit=st.integers(min_value=1, max_value=6),
    burst=st.integers(min_value=0, max_value=6),
    window_ms=st.integers(min_value=1, max_value=300),
)
def test_retry_after_is_exact(gaps: list[int], limit: int, burst: int, window_ms: int) -> None:
    now, hits = 0, list[int]()
    for gap in gaps:
        now += gap
        answer = decide(now, hits, limit, window_ms, burst)
        if answer.allowed:
            hits.append(now)
            continue
        wait = answer.retry_after_ms
        assert wait >= 1
        assert not decide(now + wait - 1, hits, limit, window_ms, burst).allowed
        assert decide(now + wait, hits, limit, window_ms, burst).allowed


@given(
    gaps=calls,
    limit=st.integers(min_value=1, max_value=6),
    window_ms=st.integers(min_value=1, max_value=300),
)
def test_without_burst_it_is_a_plain_sliding_log(
    gaps: list[int], limit: int, window_ms: int
) -> None:
    now, hits = 0, list[int]()
    for gap in gaps:
        now += gap
        in_window = len([h for h in hits if h > now - window_ms])
        answer = decide(now, hits, limit, window_ms, 0)
        assert answer.allowed == (in_window < limit)
        if answer.allowed:
            hits.append(now)


@pytest.mark.parametrize(
    ("at_ms", "now_ms", "moved"),
    [
        (1_000, 1_000, 1_000),  # sent as admitted
        (1_000, 1_030, 1_030),  # sent 30 ms later: counted from then
        (1_000, 1_049, 1_049),  # the last moment in the 50 ms window
        (1_000, 1_050, None),  # out of the window: stale
        (1_000, 9_000, None),
        (1_040, 1_030, 1_040),  # recorded later than "now": never moved earlier
    ],
)
def test_restamped_moves_a_hit_to_its_send_time_while_in_the_window(
    at_ms: int, now_ms: int, moved: int | None
) -> None:
    assert restamped(at_ms, now_ms, 50) == moved
