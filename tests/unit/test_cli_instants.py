"""Instants on the command line: ISO 8601 with an offset, a date or now, from 1970 to 2999."""

from __future__ import annotations

import pytest
import typer

from taskstream.cli.instants import DAY_MS, parse_instant, range_end

NOW_MS = 1_796_000_000_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("now", NOW_MS),
        ("1970-01-01", 0),
        ("1970-01-01T01:00:00+01:00", 0),
        ("2026-12-02T10:00:00Z", 1_796_205_600_000),
        ("2999-12-31T23:59:59.999Z", 32_503_680_000_000 - 1),
    ],
)
def test_accepted(text: str, ms: int) -> None:
    assert parse_instant(text, name="--at", now_ms=NOW_MS) == ms


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1969-12-31T23:59:59Z", "outside 1970-01-01T00:00Z"),
        ("0001-01-01T00:00:00+14:00", "outside 1970-01-01T00:00Z"),
        ("3000-01-01", "outside 1970-01-01T00:00Z"),
        ("9999-12-31T23:59:59Z", "outside 1970-01-01T00:00Z"),
        ("2026-12-02T10:00:00", "has no UTC offset"),
        ("tomorrow", "is not ISO 8601"),
    ],
)
def test_rejected_with_the_option_named(text: str, fragment: str) -> None:
    with pytest.raises(typer.BadParameter, match=fragment) as caught:
        parse_instant(text, name="--at", now_ms=NOW_MS)
    assert caught.value.param_hint == "--at"


DEC_1_MS = 1_796_083_200_000  # 2026-12-01T00:00:00Z


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-12-01", DEC_1_MS + DAY_MS - 1),
        ("2026-12-01T00:00:00Z", DEC_1_MS),
        ("2026-12-01T09:00:00+01:00", DEC_1_MS + 8 * 3_600_000),
        ("now", NOW_MS),
        ("2999-12-31", 32_503_680_000_000 - 1),
    ],
)
def test_a_bare_date_as_range_end_holds_its_whole_day(text: str, ms: int) -> None:
    assert range_end(text, now_ms=NOW_MS) == ms


def test_for_a_backfill_a_day_under_way_ends_now() -> None:
    now_ms = DEC_1_MS + 10 * 3_600_000
    assert range_end("2026-12-01", now_ms=now_ms, past_only=True) == now_ms
    assert range_end("2026-11-30", now_ms=now_ms, past_only=True) == DEC_1_MS - 1
    # A day still to come is not cut short: backfill refuses it as a future range.
    assert range_end("2026-12-02", now_ms=now_ms, past_only=True) == DEC_1_MS + 2 * DAY_MS - 1
