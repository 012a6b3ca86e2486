"""Fire times of a schedule (pure). Only this module evaluates crons with croniter.

All instants are UTC epoch milliseconds; no clock is read and no host timezone is used.

- `every_ms` triggers fire at multiples of the interval counted from the Unix epoch, so every
  scheduler computes the same fire times (and so the same dedupe keys) without coordination.
  DST has no effect on them.
- `cron` triggers match wall-clock times of their IANA zone: croniter walks naive local wall
  times and `localtime.resolve` maps each to UTC. Around a DST change the trigger's policy
  decides (DESIGN.md §2, `schedule.dst`):
  - a wall time that does not exist (clocks jump forward over it): `gap="shift"` fires once at
    the transition instant, the first valid instant after it; every match inside one gap,
    and a match on the wall time the clocks jump to, collapse into that one fire.
    `gap="skip"` does not fire.
  - a wall time that occurs twice (clocks fall back): `fold="first"` fires at its first
    occurrence only; `fold="both"` fires at each.

Fire times come out strictly increasing and without duplicates. `plan` lists the same fires
for humans, each with its local time and a DST note (see `PlannedFire`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal
from zoneinfo import ZoneInfo

from croniter import croniter

from taskstream.core.spec_parts import check_timezone
from taskstream.scheduler.localtime import Fold, fold_of, local_at, resolve, wall_at

GapPolicy = Literal["shift", "skip"]
FoldPolicy = Literal["first", "both"]
DstNote = Literal["gap_shifted", "gap_skipped", "fold_first", "fold_second"]

_GAP_POLICIES: Final = ("shift", "skip")
_FOLD_POLICIES: Final = ("first", "both")
_JUST_BEFORE: Final = timedelta(microseconds=1)
"""croniter starts strictly after its start time; this far before a wall time includes it."""


@dataclass(frozen=True, slots=True)
class Trigger:
    """A schedule reduced to what fire-time arithmetic needs. Exactly one of `cron`/`every_ms`.

    `cron`: 5 fields, or 6 with seconds first; read in `timezone` (IANA, required with cron).
    `every_ms`: a positive interval in milliseconds; a `timezone` beside it only labels
    `plan` lines. `gap`/`fold`: the DST policy of a cron (see the module docstring).
    """

    cron: str | None = None
    timezone: str | None = None
    every_ms: int | None = None
    gap: GapPolicy = "shift"
    fold: FoldPolicy = "first"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise ValueError("a trigger has exactly one of cron or every_ms")
        if self.every_ms is not None and self.every_ms <= 0:
            raise ValueError("every_ms must be positive")
        if self.gap not in _GAP_POLICIES:
            raise ValueError(f"gap must be one of {_GAP_POLICIES}, got {self.gap!r}")
        if self.fold not in _FOLD_POLICIES:
            raise ValueError(f"fold must be one of {_FOLD_POLICIES}, got {self.fold!r}")
        if self.cron is not None and not self.timezone:
            raise ValueError("a cron trigger needs an IANA timezone")
        if self.cron is not None and len(self.cron.split()) not in (5, 6):
            raise ValueError("a cron has 5 fields, or 6 with seconds first")
        if self.timezone is not None:
            check_timezone(self.timezone)


@dataclass(frozen=True, slots=True)
class PlannedFire:
    """One line of `taskstream plan`: a fire, or a wall time a DST gap skipped.

    - `at_ms`: the fire instant (UTC epoch ms); None only when `dst == "gap_skipped"`, since
      that wall time never occurs and nothing fires for it.
    - `local`: ISO 8601 local time in `zone`. With its UTC offset for a fire
      (`2026-10-25T02:30:00+01:00`); without one for a skipped wall time
      (`2026-03-29T02:30:00`), which has no offset.
    - `dst`: None (an ordinary wall time), `"gap_shifted"` (at least one nonexistent wall time,
      listed in `shifted_from` without offset, fires at this instant), `"gap_skipped"`,
      `"fold_first"` / `"fold_second"` (first / second occurrence of a repeated wall time;
      with `fold="first"` only the first is listed, as only it fires).

    Lines are in timeline order. A skipped wall time sits where the clocks jumped, at the
    transition instant, before any fire at that instant, and is listed when that instant is in
    the requested range.
    """

    at_ms: int | None
    local: str
    zone: str
    dst: DstNote | None = None
    shifted_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Tick:
    """One cron match on the UTC timeline.

    `at_ms`: its fire instant or, for a skipped gap wall time, the transition instant (where it
    would have been). `wall`: the naive local wall time the cron matched.
    """

    at_ms: int
    wall: datetime
    note: DstNote | None = None

    @property
    def fires(self) -> bool:
        return self.note != "gap_skipped"


class _Placer:
    """Places ascending wall times of one cron on the timeline at their first occurrence.

    Remembers the gap it is in, so the matches of a fine-grained cron inside one gap cost a
    comparison each instead of a new transition search.
    """

    def __init__(self, zone: ZoneInfo, gap: GapPolicy) -> None:
        self._zone = zone
        self._gap_note: DstNote = "gap_shifted" if gap == "shift" else "gap_skipped"
        self._gap_end: datetime | None = None  # first wall time after the current gap
        self._gap_ms = 0  # transition instant of the current gap

    def place(self, wall: datetime) -> _Tick:
        """The tick of `wall` (its first occurrence when it occurs twice)."""
        if self._gap_end is not None and wall < self._gap_end:
            return _Tick(self._gap_ms, wall, self._gap_note)
        resolved = resolve(wall, self._zone)
        if resolved.kind == "unique":
            return _Tick(resolved.first_ms, wall)
        if resolved.kind == "fold":
            return _Tick(resolved.first_ms, wall, "fold_first")
        self._gap_ms = resolved.first_ms
        self._gap_end = wall_at(resolved.first_ms, self._zone)
        return _Tick(self._gap_ms, wall, self._gap_note)


def _walls(expr: str, start: datetime) -> Iterator[datetime]:
    """Naive wall times the cron `expr` matches strictly after the naive `start`, ascending."""
    it = croniter(expr, start, second_at_beginning=len(expr.split()) == 6)
    while True:
        wall: datetime = it.get_next(datetime)
        yield wall


def _second_showings(expr: str, fold: Fold, begin: datetime, after_ms: int) -> Iterator[_Tick]:
    """Ticks of the second occurrences, after `after_ms`, of the fold's wall times that the
    cron matches after the naive wall time `begin`; in timeline order."""
    for wall in _walls(expr, begin):
        if wall >= fold.end:
            return
        at_ms = fold.second_ms(wall)
        if wall >= fold.start and at_ms > after_ms:
            yield _Tick(at_ms, wall, "fold_second")


def _cron_ticks(trigger: Trigger, after_ms: int) -> Iterator[_Tick]:
    """Ticks of a cron trigger with `at_ms > after_ms`, in timeline order, endless.

    `at_ms` never decreases; it repeats only where a gap collapses wall times onto its
    transition instant. Wall times are walked once, from the one shown at `after_ms` (from
    the end of its fold when `after_ms` is in a second showing, as every first showing is
    then past). With `fold="both"` a fold's wall times are walked again, lazily, once the
    walk has passed the fold: their second occurrences come after every first one.
    """
    expr, zone = trigger.cron or "", ZoneInfo(trigger.timezone or "UTC")
    both = trigger.fold == "both"
    start = wall_at(after_ms, zone).replace(microsecond=0)
    fold = fold_of(start, zone)
    if fold is not None and after_ms >= fold.transition_ms:
        if both:
            yield from _second_showings(expr, fold, start, after_ms)
        start, fold = fold.end - _JUST_BEFORE, None
    fold = fold if both else None
    placer = _Placer(zone, trigger.gap)
    for wall in _walls(expr, start):
        if fold is not None and wall >= fold.end:
            yield from _second_showings(expr, fold, fold.start - _JUST_BEFORE, after_ms)
            fold = None
        tick = placer.place(wall)
        if both and fold is None and tick.note == "fold_first":
            fold = fold_of(wall, zone)
        if tick.at_ms > after_ms:
            yield tick


def _increasing(instants: Iterable[int]) -> Iterator[int]:
    last: int | None = None
    for at_ms in instants:
        if last is None or at_ms > last:
            yield at_ms
            last = at_ms


def _fires(trigger: Trigger, after_ms: int) -> Iterator[int]:
    """Fire instants strictly after `after_ms`, strictly increasing, endless."""
    if trigger.every_ms is not None:
        every_ms = trigger.every_ms
        return itertools.count((after_ms // every_ms + 1) * every_ms, every_ms)
    return _increasing(tick.at_ms for tick in _cron_ticks(trigger, after_ms) if tick.fires)


def next_fire(trigger: Trigger, after_ms: int) -> int:
    """The first fire time (UTC epoch ms) strictly after `after_ms`."""
    return next(_fires(trigger, after_ms))


def is_fire_time(trigger: Trigger, at_ms: int) -> bool:
    """True when `trigger` fires at `at_ms` (UTC epoch ms)."""
    return fire_times(trigger, at_ms - 1, at_ms, limit=1) == [at_ms]


def fire_times(trigger: Trigger, after_ms: int, until_ms: int, *, limit: int) -> list[int]:
    """Fire times (UTC epoch ms) in (after_ms, until_ms], oldest first, at most `limit`.

    Strictly increasing. Work is linear in the number of cron matches walked.
    """
    in_range = itertools.takewhile(lambda at_ms: at_ms <= until_ms, _fires(trigger, after_ms))
    return list(itertools.islice(in_range, max(limit, 0)))


def plan(trigger: Trigger, from_ms: int, to_ms: int, *, limit: int) -> list[PlannedFire]:
    """Lines for `taskstream plan` in (from_ms, to_ms], in timeline order, at most `limit`.

    The `at_ms` of the lines that have one are exactly `fire_times` over the same range.
    """
    name = trigger.timezone or "UTC"
    zone = ZoneInfo(name)
    if trigger.every_ms is not None:
        instants = fire_times(trigger, from_ms, to_ms, limit=limit)
        return [PlannedFire(at_ms, _iso(local_at(at_ms, zone)), name) for at_ms in instants]
    out: list[PlannedFire] = []
    for tick in _cron_ticks(trigger, from_ms):
        if tick.at_ms > to_ms:
            break
        line = _line(tick, zone, name)
        last = out[-1] if out else None
        if last is not None and line.at_ms is not None and last.at_ms == line.at_ms:
            out[-1] = _merge(last, line)
        elif len(out) >= limit:
            break
        else:
            out.append(line)
    return out


def _line(tick: _Tick, zone: ZoneInfo, name: str) -> PlannedFire:
    if tick.note == "gap_skipped":
        return PlannedFire(None, _iso(tick.wall), name, "gap_skipped")
    shifted = (_iso(tick.wall),) if tick.note == "gap_shifted" else ()
    return PlannedFire(tick.at_ms, _iso(local_at(tick.at_ms, zone)), name, tick.note, shifted)


def _merge(line: PlannedFire, same_instant: PlannedFire) -> PlannedFire:
    """One line for two fires that collapsed onto one instant (only a gap does that)."""
    shifted = line.shifted_from + same_instant.shifted_from
    return replace(line, dst="gap_shifted" if shifted else line.dst, shifted_from=shifted)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds" if moment.microsecond else "seconds")
