"""Fire times from a table of instants: no clock, no Redis."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from taskstream.scheduler.ticks import PlannedFire, Trigger, fire_times, next_fire, plan


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
        {"every_ms": -1000},
        {"cron": "* * * *", "timezone": "UTC"},
        {"cron": "0 0 0 * * * *", "timezone": "UTC"},
        {"cron": "* * * * *", "timezone": "Mars/Olympus_Mons"},
        {"cron": "* * * * *", "timezone": "localtime"},
        {"cron": "* * * * *", "timezone": "UTC", "gap": "later"},
        {"cron": "* * * * *", "timezone": "UTC", "fold": "second"},
    ],
)
def test_invalid_triggers(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Trigger(**kwargs)  # type: ignore[arg-type]


def test_dst_policy_defaults_to_shift_and_first() -> None:
    trig = Trigger(cron="30 2 * * *", timezone="Europe/Berlin")
    assert (trig.gap, trig.fold) == ("shift", "first")


def test_plan_of_an_interval_lists_its_fires_in_utc() -> None:
    got = plan(
        Trigger(every_ms=30_000),
        ms("2026-01-01T00:00:00+00:00"),
        ms("2026-01-01T00:01:00+00:00"),
        limit=10,
    )
    assert got == [
        PlannedFire(ms("2026-01-01T00:00:30+00:00"), "2026-01-01T00:00:30+00:00", "UTC"),
        PlannedFire(ms("2026-01-01T00:01:00+00:00"), "2026-01-01T00:01:00+00:00", "UTC"),
    ]


def test_plan_shows_milliseconds_only_when_there_are_some() -> None:
    got = plan(Trigger(every_ms=1500), 0, 3000, limit=10)
    assert [line.local for line in got] == [
        "1970-01-01T00:00:01.500+00:00",
        "1970-01-01T00:00:03+00:00",
    ]


def test_limit_bounds_fire_times_and_plan() -> None:
    trig = Trigger(cron="* * * * * *", timezone="Asia/Tokyo")
    start = ms("2026-11-30T00:00:00+00:00")
    assert fire_times(trig, start, start + 86_400_000, limit=3) == [
        start + 1000,
        start + 2000,
        start + 3000,
    ]
    assert len(plan(trig, start, start + 86_400_000, limit=3)) == 3
    assert fire_times(trig, start, start + 86_400_000, limit=0) == []
