"""Waiting out a maintenance window (pure; DESIGN.md §2: "no start inside them; the run waits
or is skipped per catch-up policy").

With catch-up enabled, a start that falls inside a maintenance window is held until the window
ends, and the tick is decided again then; with catch-up disabled it is skipped
(`calendar.calendar_block`). The wait is bounded by the catch-up reach,
`fire + max(window, catchup.max_delay)`: a window that ends later skips the tick, as the
catch-up policy would skip a tick that late.

- `skipping_block`: the calendar rule that skips a start, maintenance windows included only
  when catch-up is disabled; every caller that skips by the calendar asks it.
- `maintenance_wait`: for an instant inside a window, the first instant after it outside every
  window, following windows that touch or overlap.
- `maintenance_hold`: that wait for one fire time and its start instant, and whether it ends
  past the reach.

Instants are UTC epoch milliseconds; windows are read in the task's timezone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

from taskstream.core.spec import TaskSpec
from taskstream.core.spec_parts import Calendar, MaintenanceWindow
from taskstream.scheduler.calendar import (
    CalendarBlock,
    Deferral,
    calendar_block,
    local_iso,
    maintenance_at,
    maintenance_day,
    window_text,
    zone_of,
)
from taskstream.scheduler.localtime import local_at, offset_change_ms, resolve

MAINTENANCE_SCAN_MS: Final = 8 * 24 * 3_600_000
"""How far `maintenance_wait` follows windows that touch or overlap before it gives up: a
calendar whose windows cover a whole week leaves no start."""
_MAX_STEPS: Final = 64


@dataclass(frozen=True, slots=True)
class MaintenanceHold:
    """A start held by a maintenance window: the wait (`held.until_ms` None when no window
    end comes within `MAINTENANCE_SCAN_MS`), and `past_reach` when it ends after the last
    instant the tick may start, so the tick is skipped instead."""

    held: Deferral
    past_reach: bool


def skipping_block(spec: TaskSpec, at_ms: int) -> CalendarBlock | None:
    """The calendar rule that skips a start of `spec` at `at_ms` (ms): a weekend or an excluded
    date, and a maintenance window only when the task's catch-up is disabled; with it enabled
    the window holds the start instead (`maintenance_hold`)."""
    return calendar_block(spec, at_ms, maintenance=not spec.catchup.enabled)


def maintenance_hold(spec: TaskSpec, start_ms: int, reach_ms: int) -> MaintenanceHold | None:
    """Whether a start at `start_ms` waits for a maintenance window, for a tick that may start
    until `reach_ms` (`fire + decide.catchup_reach_ms`); None when the start is outside every
    window or the task's catch-up is disabled."""
    if not spec.catchup.enabled:
        return None
    held = maintenance_wait(spec, start_ms)
    if held is None:
        return None
    return MaintenanceHold(held, held.until_ms is None or held.until_ms > reach_ms)


def maintenance_wait(spec: TaskSpec, at_ms: int) -> Deferral | None:
    """Whether a start at `at_ms` falls inside a maintenance window of `spec`; None when not.

    Otherwise `until_ms` is the first instant after `at_ms` outside every window: the end of
    the window's occurrence, followed through windows that touch or overlap it. An end in a
    DST gap is the first instant after the gap; an end the clocks show twice is its first
    showing after `at_ms`. `until_ms` is None when no such instant comes within
    `MAINTENANCE_SCAN_MS`.
    """
    if not spec.calendar.maintenance:
        return None
    zone = zone_of(spec.timezone)
    inside = maintenance_at(spec.calendar, local_at(at_ms, zone))
    if inside is None:
        return None
    shown = window_text(inside[0])
    seen: dict[str, Any] = {
        "at_ms": at_ms,
        "timezone": str(zone),
        "local_time": local_iso(at_ms, zone),
        "maintenance": shown,
        "window_started": inside[1].isoformat(),
    }
    until_ms = _maintenance_end_ms(spec.calendar, zone, at_ms, inside)
    if until_ms is None:
        return Deferral(None, f"maintenance windows from {shown} leave no start", seen)
    seen |= {"until_ms": until_ms, "until_local": local_iso(until_ms, zone)}
    return Deferral(until_ms, f"inside maintenance window {shown}, start held until its end", seen)


def _maintenance_end_ms(
    calendar: Calendar,
    zone: ZoneInfo,
    at_ms: int,
    inside: tuple[MaintenanceWindow, date] | None,
) -> int | None:
    until_ms = at_ms
    for _ in range(_MAX_STEPS):
        if inside is None:
            return until_ms
        ends = _occurrence_end_ms(*inside, zone, until_ms)
        if ends is None or ends - at_ms > MAINTENANCE_SCAN_MS:
            return None
        until_ms = ends
        inside = maintenance_at(calendar, local_at(until_ms, zone))
    return None


def _occurrence_end_ms(
    window: MaintenanceWindow, started_on: date, zone: ZoneInfo, after_ms: int
) -> int | None:
    """The first instant after `after_ms` at which the occurrence of `window` that started on
    `started_on` (local date) has ended: its end time, or earlier when the clocks fall back
    out of it first (a window from 01:15 to 02:00 is left when 01:59 becomes 01:00 again)."""
    ends_on = started_on + timedelta(days=1) if window.end < window.start else started_on
    resolved = resolve(datetime.combine(ends_on, window.end), zone)
    later = [
        ms for ms in (resolved.first_ms, resolved.second_ms) if ms is not None and ms > after_ms
    ]
    ends = min(later, default=None)
    shift = None if ends is None else offset_change_ms(zone, after_ms, ends)
    if shift is not None and maintenance_day(window, local_at(shift, zone)) != started_on:
        return shift
    return ends
