"""`maintenance_wait` against `calendar_block`, over random windows near DST transitions: the
wait ends at the first instant outside every window, and every instant before it is inside
one. The table cases are in test_calendar.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from taskstream.core.spec import TaskSpec
from taskstream.scheduler.calendar import calendar_block
from taskstream.scheduler.decide import decide_tick
from taskstream.scheduler.maintenance import maintenance_wait
from taskstream.scheduler.verdict import DEFERRED, SHOULD_RUN, SKIP_CALENDAR, TickFacts

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR_MS = 3_600_000
STEPS = 24
"""Instants checked between a start and the end of its wait."""


def utc_ms(year: int, month: int, day: int, hour: int) -> int:
    return (datetime(year, month, day, hour, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)


TRANSITIONS = [
    ("Europe/Berlin", utc_ms(2026, 3, 29, 1)),
    ("Europe/Berlin", utc_ms(2026, 10, 25, 1)),
    ("America/New_York", utc_ms(2026, 3, 8, 7)),
    ("America/New_York", utc_ms(2026, 11, 1, 6)),
    ("Australia/Lord_Howe", utc_ms(2026, 4, 4, 15)),
    ("Asia/Tokyo", utc_ms(2026, 6, 5, 0)),
]
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@st.composite
def windows(draw: st.DrawFn) -> dict[str, Any]:
    start, end = draw(st.integers(0, 24 * 4 - 1)), draw(st.integers(0, 24 * 4 - 1))
    if start == end:
        end = (end + 1) % (24 * 4)
    window: dict[str, Any] = {"start": f"{start // 4:02d}:{start % 4 * 15:02d}"}
    window["end"] = f"{end // 4:02d}:{end % 4 * 15:02d}"
    days = draw(st.none() | st.sets(st.sampled_from(DAYS), min_size=1))
    if days is not None:
        window["days"] = sorted(days)
    return window


def task(zone: str, maintenance: list[dict[str, Any]], **fields: Any) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "id": "t",
            "agent": "echo",
            "schedule": {"cron": "0 * * * *", "timezone": zone},
            "calendar": {"maintenance": maintenance},
            **fields,
        }
    )


@settings(max_examples=150, deadline=None)
@given(
    where=st.sampled_from(TRANSITIONS),
    maintenance=st.lists(windows(), min_size=1, max_size=3),
    offset_ms=st.integers(-30 * HOUR_MS, 30 * HOUR_MS),
)
# 01:59:59.999 EDT on the night New York falls back: the clocks show 01:00 again next, outside
# 01:15-02:00, so the wait ends there and not at 02:00 EST an hour later.
@example(TRANSITIONS[3], [{"start": "01:15", "end": "02:00"}], -1)
@example(TRANSITIONS[3], [{"start": "00:30", "end": "02:00"}], -1)
def test_the_wait_ends_at_the_first_instant_outside_every_window(
    where: tuple[str, int], maintenance: list[dict[str, Any]], offset_ms: int
) -> None:
    spec = task(where[0], maintenance)
    at_ms = where[1] + offset_ms
    held = maintenance_wait(spec, at_ms)
    inside = calendar_block(spec, at_ms)
    assert (held is None) == (inside is None)
    if held is None or held.until_ms is None:
        return
    until = held.until_ms
    assert until > at_ms
    assert calendar_block(spec, until) is None, "the wait ends outside every window"
    span = until - at_ms
    for step in range(STEPS):
        between = at_ms + span * step // STEPS
        assert calendar_block(spec, between) is not None, "no start before the wait ends"
    assert calendar_block(spec, until - 1) is not None, "it ends at the first instant outside"


@settings(max_examples=80, deadline=None)
@given(
    where=st.sampled_from(TRANSITIONS),
    maintenance=st.lists(windows(), min_size=1, max_size=2),
    offset_ms=st.integers(-30 * HOUR_MS, 30 * HOUR_MS),
    max_delay_min=st.integers(0, 600),
    enabled=st.booleans(),
)
def test_a_tick_inside_a_window_waits_within_the_reach_or_is_skipped(
    where: tuple[str, int],
    maintenance: list[dict[str, Any]],
    offset_ms: int,
    max_delay_min: int,
    enabled: bool,
) -> None:
    """The decision on time: deferred to the wait's end when catch-up is on and that end is
    by fire + max(10 min window, max_delay); otherwise skip_calendar."""
    catchup = {"enabled": enabled, "max_delay": f"{max_delay_min}m"}
    spec = task(where[0], maintenance, window="10m", catchup=catchup)
    fire_ms = where[1] + offset_ms
    held = maintenance_wait(spec, fire_ms)
    got = decide_tick(TickFacts(fire_ms), spec, fire_ms)
    if held is None:
        assert got.decision == SHOULD_RUN
        return
    reach_ms = fire_ms + max(10, max_delay_min) * 60_000
    waits = enabled and held.until_ms is not None and held.until_ms <= reach_ms
    assert got.decision == (DEFERRED if waits else SKIP_CALENDAR), got.reason
    assert got.until_ms == (held.until_ms if waits else None)
    assert got.details["calendar"]["rule"] == "maintenance"
