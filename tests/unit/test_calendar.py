"""Calendar blocks and not_before / off_peak deferral, read in the task's zone, never the host's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from taskstream.core.spec import TaskSpec
from taskstream.core.spec_parts import Calendar
from taskstream.scheduler.calendar import (
    allowed_ranges,
    calendar_block,
    defer_until,
    offset_changes,
)
from taskstream.scheduler.maintenance import maintenance_wait

NEW_YORK = "America/New_York"
TOKYO = "Asia/Tokyo"
BERLIN = "Europe/Berlin"


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def at(tz: str, y: int, mo: int, d: int, h: int, mi: int, s: int = 0, us: int = 0) -> int:
    """UTC epoch ms of a local wall time in `tz` (first showing when the clocks repeat it)."""
    return (datetime(y, mo, d, h, mi, s, us, tzinfo=ZoneInfo(tz)) - EPOCH) // timedelta(
        milliseconds=1
    )


def utc(y: int, mo: int, d: int, h: int, mi: int) -> int:
    return at("UTC", y, mo, d, h, mi)


def spec(tz: str, **fields: Any) -> TaskSpec:
    schedule = {"cron": "0 9 * * *", "timezone": tz}
    return TaskSpec.model_validate({"id": "t", "agent": "echo", "schedule": schedule, **fields})


NO_WEEKEND = spec(NEW_YORK, calendar={"allow_weekend": False})
EXCLUDED = spec(NEW_YORK, calendar={"exclude_dates": ["2026-12-24"]})
SAT_NIGHT = spec(
    NEW_YORK, calendar={"maintenance": [{"start": "23:00", "end": "01:30", "days": ["sat"]}]}
)
NOON = spec(NEW_YORK, calendar={"maintenance": [{"start": "12:00", "end": "13:00"}]})


@pytest.mark.parametrize(
    ("task", "at_ms", "rule"),
    [
        # 2026-03-06 is a Friday; New York is UTC-5 until 2026-03-08, UTC-4 after.
        (NO_WEEKEND, at(NEW_YORK, 2026, 3, 6, 23, 59, 59, 999_000), None),
        (NO_WEEKEND, at(NEW_YORK, 2026, 3, 7, 0, 0), "weekend"),
        (NO_WEEKEND, utc(2026, 3, 7, 4, 30), None),  # Saturday in UTC, Friday 23:30 local
        (NO_WEEKEND, utc(2026, 3, 7, 5, 0), "weekend"),  # Saturday 00:00 local
        (NO_WEEKEND, at(NEW_YORK, 2026, 3, 8, 23, 59, 59, 999_000), "weekend"),
        (NO_WEEKEND, utc(2026, 3, 9, 3, 59), "weekend"),  # Monday in UTC, Sunday 23:59 local
        (NO_WEEKEND, at(NEW_YORK, 2026, 3, 9, 0, 0), None),
        (EXCLUDED, at(NEW_YORK, 2026, 12, 23, 23, 59, 59, 999_000), None),
        (EXCLUDED, at(NEW_YORK, 2026, 12, 24, 0, 0), "exclude_date"),
        (EXCLUDED, utc(2026, 12, 24, 4, 59), None),  # 23:59 on the 23rd in New York
        (EXCLUDED, utc(2026, 12, 25, 4, 59), "exclude_date"),  # 23:59 on the 24th
        (EXCLUDED, at(NEW_YORK, 2026, 12, 25, 0, 0), None),
        # A window from Saturday 23:00 to Sunday 01:30; `days` names the day it starts on.
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 7, 22, 59), None),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 7, 23, 0), "maintenance"),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 0, 0), "maintenance"),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 1, 29, 59, 999_000), "maintenance"),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 1, 30), None),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 7, 1, 0), None),  # Friday's night: not listed
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 23, 30), None),  # Sunday's night: not listed
        (SAT_NIGHT, utc(2026, 3, 8, 4, 0), "maintenance"),  # 23:00 Saturday local
        (NOON, at(NEW_YORK, 2026, 6, 5, 11, 59), None),
        (NOON, at(NEW_YORK, 2026, 6, 5, 12, 0), "maintenance"),
        (NOON, at(NEW_YORK, 2026, 6, 5, 13, 0), None),
        (spec(NEW_YORK), at(NEW_YORK, 2026, 3, 7, 12, 0), None),
    ],
)
def test_calendar_block(task: TaskSpec, at_ms: int, rule: str | None) -> None:
    block = calendar_block(task, at_ms)
    assert (None if block is None else block.rule) == rule


def test_block_reports_the_values_it_saw() -> None:
    block = calendar_block(SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 0, 15))
    assert block is not None
    assert block.details["timezone"] == NEW_YORK
    assert block.details["local_time"] == "2026-03-08T00:15:00.000-05:00"
    assert block.details["weekday"] == "sun"
    assert block.details["maintenance"] == "23:00-01:30 on sat"
    assert block.details["window_started"] == "2026-03-07"
    assert "maintenance" in block.reason


def test_the_first_matching_rule_is_reported() -> None:
    every_rule = spec(
        NEW_YORK,
        calendar={
            "allow_weekend": False,
            "exclude_dates": ["2026-03-07"],
            "maintenance": [{"start": "00:00", "end": "23:59"}],
        },
    )
    noon_saturday = at(NEW_YORK, 2026, 3, 7, 12, 0)
    assert (block := calendar_block(every_rule, noon_saturday)) and block.rule == "weekend"


def test_a_bare_calendar_takes_its_timezone() -> None:
    calendar = Calendar(allow_weekend=False)
    friday_night_ny = utc(2026, 3, 7, 4, 30)
    assert calendar_block(calendar, friday_night_ny, NEW_YORK) is None
    assert calendar_block(calendar, friday_night_ny) is not None  # UTC: already Saturday
    with pytest.raises(ValueError, match="bare Calendar"):
        calendar_block(NO_WEEKEND, friday_night_ny, NEW_YORK)


def windows(tz: str, *ranges: tuple[str, str]) -> TaskSpec:
    return spec(tz, calendar={"maintenance": [{"start": a, "end": b} for a, b in ranges]})


BERLIN_NIGHT = windows(BERLIN, ("01:00", "02:30"))
"""Berlin's clocks jump from 02:00 to 03:00 on 2026-03-29 and show 02:00-03:00 twice on
2026-10-25 (CEST, UTC+2, then CET, UTC+1)."""


@pytest.mark.parametrize(
    ("task", "at_ms", "until_ms"),
    [
        (NOON, at(NEW_YORK, 2026, 6, 5, 11, 59), None),
        (NOON, at(NEW_YORK, 2026, 6, 5, 12, 0), at(NEW_YORK, 2026, 6, 5, 13, 0)),
        (NOON, at(NEW_YORK, 2026, 6, 5, 12, 59, 59, 999_000), at(NEW_YORK, 2026, 6, 5, 13, 0)),
        (NOON, at(NEW_YORK, 2026, 6, 5, 13, 0), None),
        # Past midnight, on the day the window started on only.
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 7, 23, 30), at(NEW_YORK, 2026, 3, 8, 1, 30)),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 1, 0), at(NEW_YORK, 2026, 3, 8, 1, 30)),
        (SAT_NIGHT, at(NEW_YORK, 2026, 3, 8, 23, 30), None),
        # Windows that overlap or touch are waited out together.
        (
            windows(TOKYO, ("09:00", "10:00"), ("09:30", "11:00")),
            at(TOKYO, 2026, 6, 5, 9, 15),
            at(TOKYO, 2026, 6, 5, 11, 0),
        ),
        (
            windows(TOKYO, ("09:00", "10:00"), ("10:00", "10:30")),
            at(TOKYO, 2026, 6, 5, 9, 15),
            at(TOKYO, 2026, 6, 5, 10, 30),
        ),
        # An end inside the DST gap: the first instant after it (03:00 CEST).
        (BERLIN_NIGHT, at(BERLIN, 2026, 3, 29, 1, 30), utc(2026, 3, 29, 1, 0)),
        # An end the clocks show twice: its next showing.
        (BERLIN_NIGHT, utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 0, 30)),  # 01:30 CEST
        (BERLIN_NIGHT, utc(2026, 10, 25, 1, 15), utc(2026, 10, 25, 1, 30)),  # 02:15 CET
    ],
)
def test_maintenance_wait(task: TaskSpec, at_ms: int, until_ms: int | None) -> None:
    held = maintenance_wait(task, at_ms)
    assert (None if held is None else held.until_ms) == until_ms


def test_windows_that_cover_every_hour_leave_no_start() -> None:
    always = windows(TOKYO, ("00:00", "12:00"), ("12:00", "00:00"))
    held = maintenance_wait(always, at(TOKYO, 2026, 6, 5, 9, 0))
    assert held is not None and held.until_ms is None
    assert "leave no start" in held.reason


def test_maintenance_wait_reports_the_values_it_saw() -> None:
    held = maintenance_wait(SAT_NIGHT, utc(2026, 3, 8, 4, 0))
    assert held is not None
    assert held.details == {
        "at_ms": utc(2026, 3, 8, 4, 0),
        "timezone": NEW_YORK,
        "local_time": "2026-03-07T23:00:00.000-05:00",
        "maintenance": "23:00-01:30 on sat",
        "window_started": "2026-03-07",
        "until_ms": at(NEW_YORK, 2026, 3, 8, 1, 30),
        "until_local": "2026-03-08T01:30:00.000-05:00",
    }


def test_a_block_can_leave_maintenance_out() -> None:
    noon = at(NEW_YORK, 2026, 6, 5, 12, 0)
    assert calendar_block(NOON, noon, maintenance=False) is None
    assert (block := calendar_block(NOON, noon)) and block.rule == "maintenance"


NOT_BEFORE = spec(TOKYO, not_before="07:30")
NIGHTS = spec(TOKYO, off_peak={"start": "22:00", "end": "06:00"})
EARLY_HOURS = spec(TOKYO, off_peak={"start": "01:00", "end": "05:00"})
BOTH = spec(TOKYO, not_before="07:30", off_peak={"start": "22:00", "end": "06:00"})
NEVER = spec(TOKYO, not_before="07:30", off_peak={"start": "01:00", "end": "05:00"})
GAP = spec(BERLIN, off_peak={"start": "02:30", "end": "05:00"})
IN_GAP = spec(BERLIN, off_peak={"start": "02:10", "end": "02:50"})
EARLY_FOLD = spec(BERLIN, off_peak={"start": "01:00", "end": "02:30"})


@pytest.mark.parametrize(
    ("task", "at_ms", "until_ms"),
    [
        (spec(TOKYO), at(TOKYO, 2026, 6, 5, 3, 0), None),
        (NOT_BEFORE, at(TOKYO, 2026, 6, 5, 6, 0), at(TOKYO, 2026, 6, 5, 7, 30)),
        (NOT_BEFORE, at(TOKYO, 2026, 6, 5, 0, 0), at(TOKYO, 2026, 6, 5, 7, 30)),
        (NOT_BEFORE, at(TOKYO, 2026, 6, 5, 7, 29, 59, 999_000), at(TOKYO, 2026, 6, 5, 7, 30)),
        (NOT_BEFORE, at(TOKYO, 2026, 6, 5, 7, 30), None),
        (NOT_BEFORE, at(TOKYO, 2026, 6, 5, 23, 59), None),
        (NIGHTS, at(TOKYO, 2026, 6, 5, 7, 0), at(TOKYO, 2026, 6, 5, 22, 0)),
        (NIGHTS, at(TOKYO, 2026, 6, 5, 6, 0), at(TOKYO, 2026, 6, 5, 22, 0)),
        (NIGHTS, at(TOKYO, 2026, 6, 5, 5, 59), None),
        (NIGHTS, at(TOKYO, 2026, 6, 5, 22, 0), None),
        (NIGHTS, at(TOKYO, 2026, 6, 5, 0, 0), None),
        (EARLY_HOURS, at(TOKYO, 2026, 6, 5, 6, 0), at(TOKYO, 2026, 6, 6, 1, 0)),
        (EARLY_HOURS, at(TOKYO, 2026, 6, 5, 0, 59), at(TOKYO, 2026, 6, 5, 1, 0)),
        (BOTH, at(TOKYO, 2026, 6, 5, 6, 0), at(TOKYO, 2026, 6, 5, 22, 0)),
        (BOTH, at(TOKYO, 2026, 6, 5, 2, 0), at(TOKYO, 2026, 6, 5, 22, 0)),
        (BOTH, at(TOKYO, 2026, 6, 5, 23, 0), None),
        # 2026-03-29: Berlin's clocks jump from 02:00 to 03:00; 02:30 never shows.
        (GAP, at(BERLIN, 2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0)),  # 03:00 CEST
        (GAP, at(BERLIN, 2026, 3, 28, 6, 0), utc(2026, 3, 29, 1, 0)),
        (GAP, at(BERLIN, 2026, 3, 29, 3, 0), None),
        # A range wholly inside the gap has no local time that day: the next day's start.
        (IN_GAP, at(BERLIN, 2026, 3, 29, 1, 0), at(BERLIN, 2026, 3, 30, 2, 10)),
        (IN_GAP, at(BERLIN, 2026, 3, 28, 6, 0), at(BERLIN, 2026, 3, 30, 2, 10)),
        # 2026-10-25: Berlin's clocks fall back from 03:00 CEST to 02:00 CET; 02:30 shows twice.
        (GAP, utc(2026, 10, 25, 0, 10), utc(2026, 10, 25, 0, 30)),  # 02:10 CEST -> 02:30 CEST
        (GAP, utc(2026, 10, 25, 1, 10), utc(2026, 10, 25, 1, 30)),  # 02:10 CET -> 02:30 CET
        # An allowed range that the clocks fall back into: the first instant after the fold
        # begins (02:00 CET), not the next day's start.
        (EARLY_FOLD, utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0)),  # 02:30 CEST -> 02:00 CET
        (EARLY_FOLD, utc(2026, 10, 25, 0, 45), utc(2026, 10, 25, 1, 0)),  # 02:45 CEST -> 02:00 CET
        (EARLY_FOLD, utc(2026, 10, 25, 1, 30), at(BERLIN, 2026, 10, 26, 1, 0)),  # 02:30 CET
        (EARLY_FOLD, utc(2026, 10, 25, 0, 20), None),  # 02:20 CEST is allowed
    ],
)
def test_defer_until(task: TaskSpec, at_ms: int, until_ms: int | None) -> None:
    held = defer_until(task, at_ms)
    assert (None if held is None else held.until_ms) == until_ms
    if held is not None:
        assert held.until_ms is not None and held.until_ms > at_ms


@pytest.mark.parametrize(
    ("tz", "changes"),
    [
        (BERLIN, [utc(2026, 3, 29, 1, 0), utc(2026, 10, 25, 1, 0)]),
        (NEW_YORK, [utc(2026, 3, 8, 7, 0), utc(2026, 11, 1, 6, 0)]),
        (TOKYO, []),
    ],
)
def test_offset_changes_are_the_first_instants_of_each_new_offset(
    tz: str, changes: list[int]
) -> None:
    year = (utc(2026, 1, 1, 0, 0), utc(2027, 1, 1, 0, 0))
    assert offset_changes(*year, ZoneInfo(tz)) == changes
    for change in changes:  # (start, end]: a search that starts at a change does not see it
        assert offset_changes(change, change + 1, ZoneInfo(tz)) == []
        assert offset_changes(change - 1, change, ZoneInfo(tz)) == [change]


def test_rules_that_exclude_each_other_never_allow_a_start() -> None:
    assert allowed_ranges(NEVER.not_before, NEVER.off_peak) == []
    held = defer_until(NEVER, at(TOKYO, 2026, 6, 5, 3, 0))
    assert held is not None and held.until_ms is None
    assert "no local time" in held.reason


def test_deferral_reports_the_values_it_saw() -> None:
    held = defer_until(BOTH, at(TOKYO, 2026, 6, 5, 6, 0))
    assert held is not None
    assert held.details == {
        "at_ms": at(TOKYO, 2026, 6, 5, 6, 0),
        "timezone": TOKYO,
        "local_time": "2026-06-05T06:00:00.000+09:00",
        "not_before": "07:30",
        "off_peak": "22:00-06:00",
        "until_ms": at(TOKYO, 2026, 6, 5, 22, 0),
        "until_local": "2026-06-05T22:00:00.000+09:00",
    }


@pytest.mark.parametrize(
    ("not_before", "off_peak", "ranges"),
    [
        (None, None, [(0, 1440)]),
        ("07:30", None, [(450, 1440)]),
        (None, ("22:00", "06:00"), [(0, 360), (1320, 1440)]),
        ("07:30", ("22:00", "06:00"), [(1320, 1440)]),
        ("03:00", ("22:00", "06:00"), [(180, 360), (1320, 1440)]),
        ("07:30", ("08:00", "17:00"), [(480, 1020)]),
    ],
)
def test_allowed_ranges(
    not_before: str | None, off_peak: tuple[str, str] | None, ranges: list[tuple[int, int]]
) -> None:
    fields: dict[str, Any] = {"not_before": not_before}
    if off_peak is not None:
        fields["off_peak"] = {"start": off_peak[0], "end": off_peak[1]}
    task = spec(TOKYO, **fields)
    assert allowed_ranges(task.not_before, task.off_peak) == ranges
