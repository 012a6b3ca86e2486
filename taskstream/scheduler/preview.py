"""`taskstream plan`: the planned fires of a task in a range, each with the calendar rule
that would skip it or the holds of its start, as the scheduler would decide them. Pure: runs
nothing, writes nothing; instants are UTC epoch milliseconds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from taskstream.core.spec import TaskSpec
from taskstream.scheduler import decide
from taskstream.scheduler.calendar import CalendarBlock, Deferral, defer_until
from taskstream.scheduler.instances import scheduled_trigger
from taskstream.scheduler.maintenance import maintenance_hold, skipping_block
from taskstream.scheduler.ticks import PlannedFire, plan


@dataclass(frozen=True, slots=True)
class PreviewLine:
    """One line of `taskstream plan`: a planned fire, the calendar rule that would skip it
    (`excluded`), and the hold of its start (`deferral`): a maintenance window it waits out
    (`details["maintenance"]` set; catch-up enabled) or `not_before` / `off_peak`.
    `held_past_window` when that hold ends too late: after fire time + window for
    `not_before` / `off_peak` (`skip_window`), past the catch-up reach for a maintenance
    window (`skip_calendar`)."""

    fire: PlannedFire
    excluded: CalendarBlock | None = None
    deferral: Deferral | None = None
    held_past_window: bool = False


def preview(spec: TaskSpec, *, from_ms: int, to_ms: int, limit: int) -> list[PreviewLine]:
    """Planned fires of `spec` in [from_ms, to_ms] (ms), at most `limit` lines, each with the
    calendar rule that excludes it or the deferral of its start. Pure; runs nothing."""
    lines: list[PreviewLine] = []
    for fire in plan(scheduled_trigger(spec), from_ms - 1, to_ms, limit=limit):
        if fire.at_ms is None:
            lines.append(PreviewLine(fire))
            continue
        block = skipping_block(spec, fire.at_ms)
        lines.append(
            PreviewLine(fire, block) if block is not None else _held(spec, fire, fire.at_ms)
        )
    return lines


_HOLDS_FOLLOWED: Final = 8
"""Holds followed one after another for one plan line (a maintenance window, then
`not_before`, then another window, ...); real calendars need two or three."""


def _held(spec: TaskSpec, fire: PlannedFire, fire_ms: int) -> PreviewLine:
    """The line of a fire the calendar lets start: the holds of its start followed as the
    scheduler decides them (`decide_tick`), each from where the one before ends. The line
    shows the last: where the start ends up, or the hold that ends too late (see
    `PreviewLine`), or the calendar rule that skips the start it was held to."""
    start_ms, last, late = fire_ms, None, False
    closes_ms = fire_ms + round(spec.window * 1000)
    reach_ms = fire_ms + decide.catchup_reach_ms(spec)
    for _ in range(_HOLDS_FOLLOWED):
        if start_ms != fire_ms and (block := skipping_block(spec, start_ms)) is not None:
            return PreviewLine(fire, block)
        waits = maintenance_hold(spec, start_ms, reach_ms)
        held = waits.held if waits is not None else defer_until(spec, start_ms)
        if held is None:
            break
        last = held
        # A maintenance wait that ends after the window makes the tick a late one, which
        # catch-up decides within its reach (`decide._open_until_ms`).
        past = (
            waits.past_reach if waits is not None else _past(held, reach_ms if late else closes_ms)
        )
        if past or held.until_ms is None:
            return PreviewLine(fire, None, held, True)
        late = late or (waits is not None and held.until_ms > closes_ms)
        start_ms = held.until_ms
    return PreviewLine(fire, None, last, False)


def _past(held: Deferral, open_until_ms: int) -> bool:
    """Whether a `not_before` / `off_peak` hold ends after the tick may start (`skip_window`)."""
    return held.until_ms is None or held.until_ms > open_until_ms
