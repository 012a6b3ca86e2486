"""Cron fire times around DST changes, from tables: wall-clock cron in, UTC epoch ms out.

2026 transitions used (UTC instants of the change):
- Europe/Berlin: gap 03-29 01:00 (02:00 -> 03:00 local), fold 10-25 01:00 (03:00 -> 02:00).
- America/New_York: gap 03-08 07:00 (02:00 -> 03:00), fold 11-01 06:00 (02:00 -> 01:00).
- Australia/Sydney: fold 04-04 16:00 (03:00 -> 02:00 on 04-05), gap 10-03 16:00 (02:00 ->
  03:00 on 10-04).
- Australia/Lord_Howe (half-hour DST): fold 04-04 15:00 (02:00 -> 01:30), gap 10-03 15:30
  (02:00 -> 02:30).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise, product
from typing import NamedTuple
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskstream.scheduler.ticks import (
    DstNote,
    FoldPolicy,
    GapPolicy,
    PlannedFire,
    Trigger,
    fire_times,
    next_fire,
    plan,
)

BERLIN, NEW_YORK, SYDNEY, LORD_HOWE = (
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Row = tuple[str, str, datetime, datetime, list[datetime], list[datetime]]
GAP_POLICIES: tuple[GapPolicy, ...] = ("shift", "skip")
FOLD_POLICIES: tuple[FoldPolicy, ...] = ("first", "both")


def utc(month: int, day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """A UTC instant in 2026."""
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def mss(moments: list[datetime]) -> list[int]:
    return [ms(moment) for moment in moments]


# zone, cron, after, until, fires with gap="shift", fires with gap="skip"
GAPS: dict[str, Row] = {
    "berlin-daily": (
        BERLIN, "30 2 * * *", utc(3, 28, 12), utc(3, 30, 12),
        [utc(3, 29, 1), utc(3, 30, 0, 30)], [utc(3, 30, 0, 30)],
    ),
    "berlin-hourly": (
        BERLIN, "30 * * * *", utc(3, 28, 23), utc(3, 29, 2),
        [utc(3, 28, 23, 30), utc(3, 29, 0, 30), utc(3, 29, 1), utc(3, 29, 1, 30)],
        [utc(3, 28, 23, 30), utc(3, 29, 0, 30), utc(3, 29, 1, 30)],
    ),
    # 02:00-02:45 and 03:00 are one fire at 01:00 UTC under both policies (03:00 exists).
    "berlin-quarter": (
        BERLIN, "*/15 * * * *", utc(3, 29, 0, 30), utc(3, 29, 1, 20),
        [utc(3, 29, 0, 45), utc(3, 29, 1), utc(3, 29, 1, 15)],
        [utc(3, 29, 0, 45), utc(3, 29, 1), utc(3, 29, 1, 15)],
    ),
    "berlin-quarter-past-5": (
        BERLIN, "5-59/15 * * * *", utc(3, 29, 0, 40), utc(3, 29, 1, 10),
        [utc(3, 29, 0, 50), utc(3, 29, 1), utc(3, 29, 1, 5)],
        [utc(3, 29, 0, 50), utc(3, 29, 1, 5)],
    ),
    "berlin-second-edge": (
        BERLIN, "* * * * * *", utc(3, 29, 0, 59, 57), utc(3, 29, 1, 0, 2),
        [utc(3, 29, 0, 59, 58), utc(3, 29, 0, 59, 59), utc(3, 29, 1), utc(3, 29, 1, 0, 1),
         utc(3, 29, 1, 0, 2)],
        [utc(3, 29, 0, 59, 58), utc(3, 29, 0, 59, 59), utc(3, 29, 1), utc(3, 29, 1, 0, 1),
         utc(3, 29, 1, 0, 2)],
    ),
    "berlin-second-30": (
        BERLIN, "30 * * * * *", utc(3, 29, 0, 59), utc(3, 29, 1, 1),
        [utc(3, 29, 0, 59, 30), utc(3, 29, 1), utc(3, 29, 1, 0, 30)],
        [utc(3, 29, 0, 59, 30), utc(3, 29, 1, 0, 30)],
    ),
    "berlin-unaffected": (
        BERLIN, "0 9 * * *", utc(3, 27, 12), utc(3, 30, 12),
        [utc(3, 28, 8), utc(3, 29, 7), utc(3, 30, 7)],
        [utc(3, 28, 8), utc(3, 29, 7), utc(3, 30, 7)],
    ),
    "new-york-daily": (
        NEW_YORK, "30 2 * * *", utc(3, 7, 12), utc(3, 9, 12),
        [utc(3, 8, 7), utc(3, 9, 6, 30)], [utc(3, 9, 6, 30)],
    ),
    "new-york-hourly": (
        NEW_YORK, "0 * * * *", utc(3, 8, 5, 30), utc(3, 8, 8, 30),
        [utc(3, 8, 6), utc(3, 8, 7), utc(3, 8, 8)], [utc(3, 8, 6), utc(3, 8, 7), utc(3, 8, 8)],
    ),
    "new-york-quarter-past-10": (
        NEW_YORK, "10-59/15 * * * *", utc(3, 8, 6, 50), utc(3, 8, 7, 30),
        [utc(3, 8, 6, 55), utc(3, 8, 7), utc(3, 8, 7, 10), utc(3, 8, 7, 25)],
        [utc(3, 8, 6, 55), utc(3, 8, 7, 10), utc(3, 8, 7, 25)],
    ),
    "new-york-unaffected": (
        NEW_YORK, "0 9 * * *", utc(3, 7, 0), utc(3, 10, 0),
        [utc(3, 7, 14), utc(3, 8, 13), utc(3, 9, 13)],
        [utc(3, 7, 14), utc(3, 8, 13), utc(3, 9, 13)],
    ),
    "sydney-daily": (
        SYDNEY, "30 2 * * *", utc(10, 2, 12), utc(10, 4, 18),
        [utc(10, 2, 16, 30), utc(10, 3, 16), utc(10, 4, 15, 30)],
        [utc(10, 2, 16, 30), utc(10, 4, 15, 30)],
    ),
    "sydney-hourly": (
        SYDNEY, "30 * * * *", utc(10, 3, 14), utc(10, 3, 17),
        [utc(10, 3, 14, 30), utc(10, 3, 15, 30), utc(10, 3, 16), utc(10, 3, 16, 30)],
        [utc(10, 3, 14, 30), utc(10, 3, 15, 30), utc(10, 3, 16, 30)],
    ),
    "sydney-quarter": (
        SYDNEY, "*/15 * * * *", utc(10, 3, 15, 40), utc(10, 3, 16, 20),
        [utc(10, 3, 15, 45), utc(10, 3, 16), utc(10, 3, 16, 15)],
        [utc(10, 3, 15, 45), utc(10, 3, 16), utc(10, 3, 16, 15)],
    ),
    "sydney-second-edge": (
        SYDNEY, "*/2 * * * * *", utc(10, 3, 15, 59, 55), utc(10, 3, 16, 0, 4),
        [utc(10, 3, 15, 59, 56), utc(10, 3, 15, 59, 58), utc(10, 3, 16), utc(10, 3, 16, 0, 2),
         utc(10, 3, 16, 0, 4)],
        [utc(10, 3, 15, 59, 56), utc(10, 3, 15, 59, 58), utc(10, 3, 16), utc(10, 3, 16, 0, 2),
         utc(10, 3, 16, 0, 4)],
    ),
    "sydney-unaffected": (
        SYDNEY, "0 9 * * *", utc(10, 2, 12), utc(10, 5, 12),
        [utc(10, 2, 23), utc(10, 3, 22), utc(10, 4, 22)],
        [utc(10, 2, 23), utc(10, 3, 22), utc(10, 4, 22)],
    ),
    "lord-howe-half-hour": (
        LORD_HOWE, "15 2 * * *", utc(10, 3, 12), utc(10, 4, 18),
        [utc(10, 3, 15, 30), utc(10, 4, 15, 15)], [utc(10, 4, 15, 15)],
    ),
}  # fmt: skip

# zone, cron, after, until, fires with fold="first", fires with fold="both"
FOLDS: dict[str, Row] = {
    "berlin-daily": (
        BERLIN, "30 2 * * *", utc(10, 24, 12), utc(10, 26, 12),
        [utc(10, 25, 0, 30), utc(10, 26, 1, 30)],
        [utc(10, 25, 0, 30), utc(10, 25, 1, 30), utc(10, 26, 1, 30)],
    ),
    "berlin-hourly": (
        BERLIN, "30 * * * *", utc(10, 24, 23), utc(10, 25, 2, 45),
        [utc(10, 24, 23, 30), utc(10, 25, 0, 30), utc(10, 25, 2, 30)],
        [utc(10, 24, 23, 30), utc(10, 25, 0, 30), utc(10, 25, 1, 30), utc(10, 25, 2, 30)],
    ),
    "berlin-quarter": (
        BERLIN, "*/15 * * * *", utc(10, 24, 23, 40), utc(10, 25, 2, 10),
        [utc(10, 24, 23, 45), utc(10, 25, 0), utc(10, 25, 0, 15), utc(10, 25, 0, 30),
         utc(10, 25, 0, 45), utc(10, 25, 2)],
        [utc(10, 24, 23, 45), utc(10, 25, 0), utc(10, 25, 0, 15), utc(10, 25, 0, 30),
         utc(10, 25, 0, 45), utc(10, 25, 1), utc(10, 25, 1, 15), utc(10, 25, 1, 30),
         utc(10, 25, 1, 45), utc(10, 25, 2)],
    ),
    # `after` is late in the first 02:xx; the second 02:00:00 and 02:00:01 still follow it.
    "berlin-second-first-pass": (
        BERLIN, "* * * * * *", utc(10, 25, 0, 59, 57), utc(10, 25, 1, 0, 1),
        [utc(10, 25, 0, 59, 58), utc(10, 25, 0, 59, 59)],
        [utc(10, 25, 0, 59, 58), utc(10, 25, 0, 59, 59), utc(10, 25, 1),
         utc(10, 25, 1, 0, 1)],
    ),
    "berlin-second-fold-end": (
        BERLIN, "* * * * * *", utc(10, 25, 1, 59, 58), utc(10, 25, 2, 0, 1),
        [utc(10, 25, 2), utc(10, 25, 2, 0, 1)],
        [utc(10, 25, 1, 59, 59), utc(10, 25, 2), utc(10, 25, 2, 0, 1)],
    ),
    "berlin-unaffected": (
        BERLIN, "0 9 * * *", utc(10, 23, 12), utc(10, 26, 12),
        [utc(10, 24, 7), utc(10, 25, 8), utc(10, 26, 8)],
        [utc(10, 24, 7), utc(10, 25, 8), utc(10, 26, 8)],
    ),
    "new-york-daily": (
        NEW_YORK, "30 1 * * *", utc(10, 31, 12), utc(11, 2, 12),
        [utc(11, 1, 5, 30), utc(11, 2, 6, 30)],
        [utc(11, 1, 5, 30), utc(11, 1, 6, 30), utc(11, 2, 6, 30)],
    ),
    "new-york-hourly": (
        NEW_YORK, "0 * * * *", utc(11, 1, 3, 30), utc(11, 1, 7, 30),
        [utc(11, 1, 4), utc(11, 1, 5), utc(11, 1, 7)],
        [utc(11, 1, 4), utc(11, 1, 5), utc(11, 1, 6), utc(11, 1, 7)],
    ),
    "new-york-quarter": (
        NEW_YORK, "*/15 * * * *", utc(11, 1, 5, 20), utc(11, 1, 7, 10),
        [utc(11, 1, 5, 30), utc(11, 1, 5, 45), utc(11, 1, 7)],
        [utc(11, 1, 5, 30), utc(11, 1, 5, 45), utc(11, 1, 6), utc(11, 1, 6, 15),
         utc(11, 1, 6, 30), utc(11, 1, 6, 45), utc(11, 1, 7)],
    ),
    "new-york-second-pass-start": (
        NEW_YORK, "* * * * * *", utc(11, 1, 5, 59, 58), utc(11, 1, 6, 0, 1),
        [utc(11, 1, 5, 59, 59)],
        [utc(11, 1, 5, 59, 59), utc(11, 1, 6), utc(11, 1, 6, 0, 1)],
    ),
    "new-york-unaffected": (
        NEW_YORK, "0 9 * * *", utc(10, 31, 0), utc(11, 3, 0),
        [utc(10, 31, 13), utc(11, 1, 14), utc(11, 2, 14)],
        [utc(10, 31, 13), utc(11, 1, 14), utc(11, 2, 14)],
    ),
    "sydney-daily": (
        SYDNEY, "30 2 * * *", utc(4, 3, 12), utc(4, 5, 18),
        [utc(4, 3, 15, 30), utc(4, 4, 15, 30), utc(4, 5, 16, 30)],
        [utc(4, 3, 15, 30), utc(4, 4, 15, 30), utc(4, 4, 16, 30), utc(4, 5, 16, 30)],
    ),
    "sydney-hourly": (
        SYDNEY, "0 * * * *", utc(4, 4, 13, 30), utc(4, 4, 17, 30),
        [utc(4, 4, 14), utc(4, 4, 15), utc(4, 4, 17)],
        [utc(4, 4, 14), utc(4, 4, 15), utc(4, 4, 16), utc(4, 4, 17)],
    ),
    "sydney-quarter": (
        SYDNEY, "*/15 * * * *", utc(4, 4, 15, 35), utc(4, 4, 16, 20),
        [utc(4, 4, 15, 45)],
        [utc(4, 4, 15, 45), utc(4, 4, 16), utc(4, 4, 16, 15)],
    ),
    "sydney-unaffected": (
        SYDNEY, "0 9 * * *", utc(4, 3, 12), utc(4, 6, 12),
        [utc(4, 3, 22), utc(4, 4, 23), utc(4, 5, 23)],
        [utc(4, 3, 22), utc(4, 4, 23), utc(4, 5, 23)],
    ),
    "lord-howe-half-hour": (
        LORD_HOWE, "45 1 * * *", utc(4, 4, 12), utc(4, 5, 18),
        [utc(4, 4, 14, 45), utc(4, 5, 15, 15)],
        [utc(4, 4, 14, 45), utc(4, 4, 15, 15), utc(4, 5, 15, 15)],
    ),
}  # fmt: skip


class Case(NamedTuple):
    name: str
    trigger: Trigger
    after: datetime
    until: datetime
    expected: list[datetime]


def _cases() -> list[Case]:
    """Each row under both values of its policy, and both values of the other (no effect)."""
    cases = []
    for name, (zone, cron, after, until, shift, skip) in GAPS.items():
        gaps: tuple[tuple[GapPolicy, list[datetime]], ...] = (("shift", shift), ("skip", skip))
        for (gap, expected), fold in product(gaps, FOLD_POLICIES):
            trigger = Trigger(cron=cron, timezone=zone, gap=gap, fold=fold)
            cases.append(Case(f"gap-{name}-{gap}-{fold}", trigger, after, until, expected))
    for name, (zone, cron, after, until, first, both) in FOLDS.items():
        folds: tuple[tuple[FoldPolicy, list[datetime]], ...] = (("first", first), ("both", both))
        for (fold, expected), gap in product(folds, GAP_POLICIES):
            trigger = Trigger(cron=cron, timezone=zone, gap=gap, fold=fold)
            cases.append(Case(f"fold-{name}-{fold}-{gap}", trigger, after, until, expected))
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fire_times_around_dst(case: Case) -> None:
    after, until = ms(case.after), ms(case.until)
    assert fire_times(case.trigger, after, until, limit=1000) == mss(case.expected)
    assert next_fire(case.trigger, after) == ms(case.expected[0])


@pytest.fixture
def host_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets the process timezone (TZ + tzset); the original is restored afterwards."""

    def set_host_tz(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield set_host_tz
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("host", ["UTC", "Asia/Kathmandu", NEW_YORK, SYDNEY, BERLIN])
def test_the_host_timezone_changes_nothing(host: str, host_tz: Callable[[str], None]) -> None:
    host_tz(host)
    july = utc(7, 1, 12)
    host_offset = timedelta(seconds=time.localtime(ms(july) // 1000).tm_gmtoff)
    assert host_offset == july.astimezone(ZoneInfo(host)).utcoffset()  # the switch took effect
    for case in CASES:
        got = fire_times(case.trigger, ms(case.after), ms(case.until), limit=1000)
        assert got == mss(case.expected), case.name
    for trigger, start, end, lines in PLANS.values():
        assert plan(trigger, ms(start), ms(end), limit=100) == lines


@pytest.mark.parametrize(
    ("after", "until"),
    [(utc(3, 28, 22), utc(3, 29, 4)), (utc(10, 24, 22), utc(10, 25, 4))],
    ids=["spring-forward", "fall-back"],
)
def test_every_is_uniform_across_dst(after: datetime, until: datetime) -> None:
    trigger = Trigger(every_ms=15 * 60_000, timezone=BERLIN)
    got = fire_times(trigger, ms(after), ms(until), limit=1000)
    assert len(got) == 24
    assert {b - a for a, b in pairwise(got)} == {15 * 60_000}
    assert got[0] % (15 * 60_000) == 0
    lines = plan(trigger, ms(after), ms(until), limit=1000)
    assert [line.at_ms for line in lines] == got
    assert {line.dst for line in lines} == {None}


def line(at: datetime | None, local: str, zone: str, dst: DstNote | None = None) -> PlannedFire:
    return PlannedFire(None if at is None else ms(at), local, zone, dst)


def shifted(at: datetime, local: str, zone: str, *walls: str) -> PlannedFire:
    """A `gap_shifted` plan line standing for the nonexistent wall times `walls`."""
    return PlannedFire(ms(at), local, zone, "gap_shifted", walls)


PLANS = {
    "berlin-quarter-shift": (
        Trigger(cron="*/15 * * * *", timezone=BERLIN), utc(3, 29, 0, 40), utc(3, 29, 1, 20),
        [
            line(utc(3, 29, 0, 45), "2026-03-29T01:45:00+01:00", BERLIN),
            shifted(utc(3, 29, 1), "2026-03-29T03:00:00+02:00", BERLIN, "2026-03-29T02:00:00",
                    "2026-03-29T02:15:00", "2026-03-29T02:30:00", "2026-03-29T02:45:00"),
            line(utc(3, 29, 1, 15), "2026-03-29T03:15:00+02:00", BERLIN),
        ],
    ),
    "berlin-quarter-skip": (
        Trigger(cron="*/15 * * * *", timezone=BERLIN, gap="skip"), utc(3, 29, 0, 40),
        utc(3, 29, 1, 20),
        [
            line(utc(3, 29, 0, 45), "2026-03-29T01:45:00+01:00", BERLIN),
            line(None, "2026-03-29T02:00:00", BERLIN, "gap_skipped"),
            line(None, "2026-03-29T02:15:00", BERLIN, "gap_skipped"),
            line(None, "2026-03-29T02:30:00", BERLIN, "gap_skipped"),
            line(None, "2026-03-29T02:45:00", BERLIN, "gap_skipped"),
            line(utc(3, 29, 1), "2026-03-29T03:00:00+02:00", BERLIN),
            line(utc(3, 29, 1, 15), "2026-03-29T03:15:00+02:00", BERLIN),
        ],
    ),
    "berlin-daily-shift": (
        Trigger(cron="30 2 * * *", timezone=BERLIN), utc(3, 28, 12), utc(3, 29, 12),
        [shifted(utc(3, 29, 1), "2026-03-29T03:00:00+02:00", BERLIN, "2026-03-29T02:30:00")],
    ),
    "sydney-daily-skip": (
        Trigger(cron="30 2 * * *", timezone=SYDNEY, gap="skip"), utc(10, 3, 12), utc(10, 4, 12),
        [line(None, "2026-10-04T02:30:00", SYDNEY, "gap_skipped")],
    ),
    "new-york-daily-first": (
        Trigger(cron="30 1 * * *", timezone=NEW_YORK), utc(11, 1, 0), utc(11, 1, 12),
        [line(utc(11, 1, 5, 30), "2026-11-01T01:30:00-04:00", NEW_YORK, "fold_first")],
    ),
    "new-york-daily-both": (
        Trigger(cron="30 1 * * *", timezone=NEW_YORK, fold="both"), utc(11, 1, 0),
        utc(11, 1, 12),
        [
            line(utc(11, 1, 5, 30), "2026-11-01T01:30:00-04:00", NEW_YORK, "fold_first"),
            line(utc(11, 1, 6, 30), "2026-11-01T01:30:00-05:00", NEW_YORK, "fold_second"),
        ],
    ),
    "sydney-daily-both": (
        Trigger(cron="0 2 * * *", timezone=SYDNEY, fold="both"), utc(4, 4, 12), utc(4, 4, 18),
        [
            line(utc(4, 4, 15), "2026-04-05T02:00:00+11:00", SYDNEY, "fold_first"),
            line(utc(4, 4, 16), "2026-04-05T02:00:00+10:00", SYDNEY, "fold_second"),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("trigger", "start", "end", "expected"), PLANS.values(), ids=PLANS)
def test_plan_marks_gaps_and_folds(
    trigger: Trigger, start: datetime, end: datetime, expected: list[PlannedFire]
) -> None:
    assert plan(trigger, ms(start), ms(end), limit=100) == expected


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_plan_fires_are_fire_times(case: Case) -> None:
    lines = plan(case.trigger, ms(case.after), ms(case.until), limit=10_000)
    assert [x.at_ms for x in lines if x.at_ms is not None] == mss(case.expected)
    assert all((x.at_ms is None) == (x.dst == "gap_skipped") for x in lines)


def test_plan_limit_counts_lines_and_keeps_a_collapsed_fire_whole() -> None:
    shift, start, end, lines = PLANS["berlin-quarter-shift"]
    assert plan(shift, ms(start), ms(end), limit=2) == lines[:2]
    skip, start, end, lines = PLANS["berlin-quarter-skip"]
    assert plan(skip, ms(start), ms(end), limit=3) == lines[:3]


# (zone, UTC instant of a 2026 transition), to start property runs near one
TRANSITIONS = [
    (BERLIN, utc(3, 29, 1)),
    (BERLIN, utc(10, 25, 1)),
    (NEW_YORK, utc(3, 8, 7)),
    (NEW_YORK, utc(11, 1, 6)),
    (SYDNEY, utc(4, 4, 16)),
    (SYDNEY, utc(10, 3, 16)),
    (LORD_HOWE, utc(4, 4, 15)),
    (LORD_HOWE, utc(10, 3, 15, 30)),
]
HOUR_MS = 3_600_000


@settings(max_examples=40, deadline=None)
@given(
    where=st.sampled_from(TRANSITIONS),
    cron=st.sampled_from(["*/15 * * * *", "30 * * * *", "30 2 * * *", "*/7 * * * * *"]),
    gap=st.sampled_from(GAP_POLICIES),
    fold=st.sampled_from(FOLD_POLICIES),
    offset_ms=st.integers(-6 * HOUR_MS, 3 * HOUR_MS),
    span_ms=st.integers(0, 6 * HOUR_MS),
    cut=st.floats(0, 1),
)
def test_fire_times_increase_and_agree_with_next_fire(
    where: tuple[str, datetime],
    cron: str,
    gap: GapPolicy,
    fold: FoldPolicy,
    offset_ms: int,
    span_ms: int,
    cut: float,
) -> None:
    trigger = Trigger(cron=cron, timezone=where[0], gap=gap, fold=fold)
    after = ms(where[1]) + offset_ms
    until = after + span_ms
    got = fire_times(trigger, after, until, limit=100_000)
    assert all(a < b for a, b in pairwise(got))
    assert all(after < t <= until for t in got)
    middle = after + round(span_ms * cut)
    assert (
        fire_times(trigger, after, middle, limit=100_000)
        + fire_times(trigger, middle, until, limit=100_000)
        == got
    )
    for a, b in pairwise([after, *got[:25]]):
        assert next_fire(trigger, a) == b
    if got:
        assert next_fire(trigger, got[-1]) > until
