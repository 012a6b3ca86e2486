"""Instants and ranges given on the command line (`--from`, `--to`, `--at`), as UTC epoch ms.

A time is ISO 8601 with an offset or `Z` (`2026-12-01T09:00:00+01:00`), a bare date
(`2026-12-01`: midnight UTC, and as `--to` the end of that day, so a range of dates holds its
last day) or `now`. A time without an offset is refused: the host's timezone is never used.
Bad input is a `typer.BadParameter` naming the option (exit 2).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

import typer

from taskstream.cli.common import AgainstNow

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(3000, 1, 1, tzinfo=UTC)
"""Instants given on the command line lie in [1970-01-01, 3000-01-01) UTC: fire times are
epoch milliseconds >= 0, and the calendar arithmetic of a plan stays far from year 9999."""
_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
DAY_MS: Final = 86_400_000


def parse_instant(text: str, *, name: str, now_ms: int) -> int:
    """UTC epoch ms of `text`: `now`, a bare date (midnight UTC), or ISO 8601 with an offset
    or `Z`. A naive time is a usage error (exit 2) naming the option `name`."""
    value = text.strip()
    if value.lower() == "now":
        return now_ms
    try:
        moment = datetime.fromisoformat(value + ("T00:00Z" if _DATE.fullmatch(value) else ""))
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        why = "is not ISO 8601, a date or now" if moment is None else "has no UTC offset"
        hint = "add an offset (+01:00) or Z; the host timezone is never used"
        raise typer.BadParameter(f"{text!r} {why}: {hint}", param_hint=name)
    if not _EPOCH <= moment < LATEST:
        raise typer.BadParameter(
            f"{text!r} is outside 1970-01-01T00:00Z .. 2999-12-31T23:59:59Z", param_hint=name
        )
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def range_end(text: str, *, now_ms: int, past_only: bool = False) -> int:
    """`--to` as UTC epoch ms: as `parse_instant`, but a bare date is the last millisecond of
    that day (UTC), so `--from 2026-12-01 --to 2026-12-31` holds all of December. With
    `past_only` (backfill), a day that has begun ends at `now_ms`."""
    at_ms = parse_instant(text, name="--to", now_ms=now_ms)
    if not _DATE.fullmatch(text.strip()):
        return at_ms
    end_ms = at_ms + DAY_MS - 1
    return min(end_ms, now_ms) if past_only and at_ms <= now_ms else end_ms


def at_instant(at: str | None, now_ms: int) -> int | None:
    """`--at` as epoch ms against `now_ms`; None when not given."""
    return None if at is None else parse_instant(at, name="--at", now_ms=now_ms)


def time_range(from_: str, to: str, now_ms: int, *, past_only: bool = False) -> tuple[int, int]:
    """`--from` and `--to` as epoch ms against `now_ms`; `--from` after `--to` is refused, as
    `AgainstNow` when an end is `now_ms` (`now`, or a backfill's day under way), since the
    order then depends on whose clock `now_ms` is."""
    from_ms = parse_instant(from_, name="--from", now_ms=now_ms)
    to_ms = range_end(to, now_ms=now_ms, past_only=past_only)
    if from_ms > to_ms:
        error = AgainstNow if now_ms in (from_ms, to_ms) else typer.BadParameter
        raise error("--from is after --to", param_hint="--from")
    return from_ms, to_ms
