"""Fire times from a table of instants: no clock, no Redis."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from taskstream.scheduler.ticks import Trigger, fire_times, next_fire


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).astimezone(UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("trigger", "after", "expected"),
    [
        (Trigger(every_ms=10_000), "2026-11-30T10:00:03+00:00", "2026-11-30T10:00:10+00:00"),
        (Trigger(every_ms=10_000), "2026-11-30T10:00:10+00:00", "2026-11-30T10:00:20+00:00"),
        (
            Trigger(cron="0 9 * * *", timezone="Europe/Berlin"),
            "2026-11-30T09:00:00+00:00",
            "2026-12-01T09:00:00+01:00",
        ),
        (
            Trigger(cron="0 0 9 * * *", timezone="Asia/Tokyo"),
            "2026-11-30T00:00:00+00:00",
            "2026-12-01T09:00:00+09:00",
        ),
        (
            Trigger(cron="*/15 * * * * *", timezone="UTC"),
            "2026-11-30T10:00:01+00:00",
            "2026-11-30T10:00:15+00:00",
        ),
    ],
)
def test_next_fire(trigger: Trigger, after: str, expected: str) -> None:
    assert next_fire(trigger, ms(after)) == ms(expected)


def test_fire_times_is_half_open_and_bounded() -> None:
    trig = Trigger(every_ms=1000)
    got = fire_times(
        trig, ms("2026-01-01T00:00:00+00:00"), ms("2026-01-01T00:00:05+00:00"), limit=10
    )
    assert got == [ms(f"2026-01-01T00:00:0{s}+00:00") for s in range(1, 6)]
    assert len(fire_times(trig, 0, 10**12, limit=7)) == 7


def test_cron_fire_times_in_zone() -> None:
    trig = Trigger(cron="30 8 * * 1-5", timezone="America/New_York")
    got = fire_times(
        trig, ms("2026-11-27T00:00:00+00:00"), ms("2026-12-02T00:00:00+00:00"), limit=10
    )
    assert got == [
        ms("2026-11-27T08:30:00-05:00"),
        ms("2026-11-30T08:30:00-05:00"),
        ms("2026-12-01T08:30:00-05:00"),
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"cron": "* * * * *"},
        {"cron": "* * * * *", "every_ms": 5, "timezone": "UTC"},
        {"every_ms": 0},
    ],
)
def test_invalid_triggers(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Trigger(**kwargs)  # type: ignore[arg-type]
