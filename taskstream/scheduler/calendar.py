"""Local-time rules of a task (pure): calendar blocks, `not_before` and `off_peak` deferral.

Instants are UTC epoch milliseconds. Every local-time rule is read in the task's IANA timezone
(`schedule.timezone`, UTC when the task has none); the host's zone is never consulted.

- `calendar_block` says whether an instant falls on a day or hour on which no run may start:
  a weekend day (`allow_weekend: false`, Saturday and Sunday local), an excluded local date, or
  a maintenance window. A window is `[start, end)` in local wall time; when `end < start` it
  wraps past midnight, and its `days` name the weekday on which the window *starts* (a
  `sat 23:00-01:30` window covers Saturday 23:00 to Sunday 01:30).
- `defer_until` says, for an instant at which a start would happen, the earliest instant at or
  after it at which `not_before` (no start before that local time of day) and `off_peak` (starts
  only inside that local range) both allow a start.

Results carry the values the rule saw, JSON-ready, for the explain log.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo

from taskstream.core.spec import TaskSpec
from taskstream.core.spec_parts import Calendar, MaintenanceWindow, OffPeak
from taskstream.scheduler.localtime import local_at, offset_change_ms, resolve

WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_MIN: Final = 24 * 60
_DAY_MS: Final = 86_400_000

CalendarRule = Literal["weekend", "exclude_date", "maintenance"]


@dataclass(frozen=True, slots=True)
class CalendarBlock:
    """Why no run may start at an instant: the rule that matched and the values it saw."""

    rule: CalendarRule
    reason: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Deferral:
    """A start held back by `not_before` / `off_peak`, or by a maintenance window
    (`maintenance.maintenance_wait`).

    `until_ms` is the earliest allowed start (UTC epoch ms, always later than the instant
    asked about), or None when no local time of day satisfies both rules together.
    """

    until_ms: int | None
    reason: str
    details: dict[str, Any]


def zone_of(name: str | None) -> ZoneInfo:
    """The IANA zone `name`, or UTC for None (a task without a timezone)."""
    return ZoneInfo("UTC" if name is None else name)


def local_iso(epoch_ms: int, zone: ZoneInfo) -> str:
    """`2026-11-30T09:00:00.000+01:00`: the local wall time of `epoch_ms`, for explain output."""
    return local_at(epoch_ms, zone).isoformat(timespec="milliseconds")


def calendar_block(
    rules: TaskSpec | Calendar,
    at_ms: int,
    timezone: str | None = None,
    *,
    maintenance: bool = True,
) -> CalendarBlock | None:
    """The first calendar rule that forbids a start at `at_ms`, or None when it is allowed.

    Checked in order: weekend, excluded date, maintenance windows (in their listed order; left
    out with `maintenance=False`, for a task whose runs wait for a window's end instead).
    With a `TaskSpec` its calendar and timezone are used; with a bare `Calendar`, `timezone`
    names the zone (None is UTC). ValueError when both a spec and a timezone are given.
    """
    if isinstance(rules, TaskSpec):
        if timezone is not None:
            raise ValueError("pass a timezone only with a bare Calendar")
        calendar, timezone = rules.calendar, rules.timezone
    else:
        calendar = rules
    zone = zone_of(timezone)
    local = local_at(at_ms, zone)
    weekday = WEEKDAYS[local.weekday()]
    seen: dict[str, Any] = {
        "at_ms": at_ms,
        "timezone": str(zone),
        "local_time": local.isoformat(timespec="milliseconds"),
        "weekday": weekday,
    }
    if not calendar.allow_weekend and weekday in ("sat", "sun"):
        return CalendarBlock("weekend", f"no start on weekends ({weekday} local)", seen)
    if local.date() in calendar.exclude_dates:
        day = local.date().isoformat()
        return CalendarBlock(
            "exclude_date", f"{day} is an excluded date", {**seen, "excluded_date": day}
        )
    inside = maintenance_at(calendar, local) if maintenance else None
    if inside is not None:
        window, started_on = inside
        shown = window_text(window)
        found = {**seen, "maintenance": shown, "window_started": started_on.isoformat()}
        return CalendarBlock("maintenance", f"inside maintenance window {shown}", found)
    return None


def maintenance_at(calendar: Calendar, local: datetime) -> tuple[MaintenanceWindow, date] | None:
    """The first listed window whose occurrence contains `local`, with the date it started."""
    for window in calendar.maintenance:
        started_on = maintenance_day(window, local)
        if started_on is not None:
            return window, started_on
    return None


def maintenance_day(window: MaintenanceWindow, local: datetime) -> date | None:
    """The local date on which the occurrence of `window` containing `local` started, or None
    when `local` is outside every occurrence (including ones ruled out by `window.days`)."""
    now = local.time()
    if window.start < window.end:
        started = local.date() if window.start <= now < window.end else None
    elif now >= window.start:
        started = local.date()
    elif now < window.end:
        started = local.date() - timedelta(days=1)
    else:
        started = None
    if started is None or window.days is None:
        return started
    return started if WEEKDAYS[started.weekday()] in window.days else None


def window_text(window: MaintenanceWindow) -> str:
    days = "" if window.days is None else " on " + ",".join(window.days)
    return f"{window.start:%H:%M}-{window.end:%H:%M}{days}"


def _minutes(value: time) -> int:
    return value.hour * 60 + value.minute


def allowed_ranges(not_before: time | None, off_peak: OffPeak | None) -> list[tuple[int, int]]:
    """Local minute-of-day ranges `[a, b)` (0..1440) in which both rules allow a start.

    Empty when the rules exclude each other (e.g. `not_before: 07:30`, off-peak 01:00-05:00).
    """
    if off_peak is None:
        ranges = [(0, _DAY_MIN)]
    elif off_peak.start < off_peak.end:
        ranges = [(_minutes(off_peak.start), _minutes(off_peak.end))]
    else:
        ranges = [(0, _minutes(off_peak.end)), (_minutes(off_peak.start), _DAY_MIN)]
    floor = 0 if not_before is None else _minutes(not_before)
    return [(max(a, floor), b) for a, b in ranges if max(a, floor) < b]


def _allowed(local: datetime, ranges: list[tuple[int, int]]) -> bool:
    second = local.hour * 3600 + local.minute * 60 + local.second
    return any(a * 60 <= second < b * 60 for a, b in ranges)


def defer_until(spec: TaskSpec, at_ms: int) -> Deferral | None:
    """Whether a start at `at_ms` must wait for `not_before` / `off_peak`; None when it may
    start then (or the task has neither rule).

    Otherwise `until_ms` is the earliest later instant whose local time of day is allowed by
    both: the next start of an allowed range, today, tomorrow or (when a DST gap swallows
    tomorrow's range) the day after (local), or, on the day the clocks fall back into an
    allowed range, the instant they do. A range start that a DST gap skips becomes the
    first instant after the gap when that instant is still inside the range; a range wholly
    inside the gap has no local time that day, so the start waits for the next day's range.
    """
    if spec.not_before is None and spec.off_peak is None:
        return None
    zone = zone_of(spec.timezone)
    local = local_at(at_ms, zone)
    ranges = allowed_ranges(spec.not_before, spec.off_peak)
    seen: dict[str, Any] = {
        "at_ms": at_ms,
        "timezone": str(zone),
        "local_time": local.isoformat(timespec="milliseconds"),
        "not_before": None if spec.not_before is None else f"{spec.not_before:%H:%M}",
        "off_peak": None if spec.off_peak is None else _range_text(spec.off_peak),
    }
    if _allowed(local, ranges):
        return None
    until_ms = _next_allowed_ms(local, ranges, at_ms, zone)
    if until_ms is None:
        return Deferral(None, "not_before and off_peak leave no local time to start", seen)
    seen |= {"until_ms": until_ms, "until_local": local_iso(until_ms, zone)}
    return Deferral(until_ms, f"start held until {seen['until_local']}", seen)


def _range_text(window: OffPeak) -> str:
    return f"{window.start:%H:%M}-{window.end:%H:%M}"


def _next_allowed_ms(
    local: datetime, ranges: list[tuple[int, int]], after_ms: int, zone: ZoneInfo
) -> int | None:
    """The earliest allowed instant after `after_ms`: a range start on the local date of
    `local` or one of the next two (a DST gap can swallow a whole range on one of them, never
    on two days in a row), or the instant the clocks fall back into a range. A start in a DST
    gap resolves to the end of the gap, one in a fold to either showing; a candidate counts
    only if its local time really is allowed."""
    candidates: list[int] = []
    for offset in (0, 1, 2):
        day = local.date() + timedelta(days=offset)
        for a, _ in ranges:
            resolved = resolve(datetime(day.year, day.month, day.day, a // 60, a % 60), zone)
            candidates += [c for c in (resolved.first_ms, resolved.second_ms) if c is not None]
    # When the clocks fall back into an allowed range, its first instant is no range start.
    candidates += offset_changes(after_ms, after_ms + 3 * _DAY_MS, zone)
    allowed = [c for c in candidates if c > after_ms and _allowed(local_at(c, zone), ranges)]
    return min(allowed, default=None)


def offset_changes(start_ms: int, end_ms: int, zone: ZoneInfo) -> list[int]:
    """The instants (UTC epoch ms) in (start_ms, end_ms] at which `zone`'s UTC offset
    changes (`localtime.offset_change_ms`, looked for a day at a time: no zone changes its
    offset and back within one day)."""
    days = range(start_ms, end_ms, _DAY_MS)
    found = (offset_change_ms(zone, day, min(day + _DAY_MS, end_ms)) for day in days)
    return [change for change in found if change is not None]
