"""Instants on the command line: ISO 8601 with an offset, a date or now, from 1970 to 2999."""

from __future__ import annotations

import pytest
import typer

from taskstream.cli.sched_cmds import parse_instant

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
