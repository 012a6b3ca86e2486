"""Local wall-clock time <-> UTC instants in one IANA zone (pure: no clock, no host timezone).

A wall time is a naive `datetime` read on the clocks of a zone. Around a change of UTC offset
it maps to zero instants (a gap: clocks jump forward over it) or to two (a fold: clocks fall
back and show it twice); everywhere else to exactly one. Instants are UTC epoch milliseconds,
computed with integer arithmetic so no float rounding creeps in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal
from zoneinfo import ZoneInfo

_EPOCH: Final = datetime(1970, 1, 1)
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)

WallKind = Literal["unique", "gap", "fold"]


@dataclass(frozen=True, slots=True)
class Resolved:
    """How one wall time maps to instants (UTC epoch ms).

    - `unique`: `first_ms` is its only instant; `second_ms` is None.
    - `fold`: it occurs twice; `first_ms` (before the clocks fall back) < `second_ms` (after).
    - `gap`: it never occurs; `first_ms` is the transition instant, the first valid instant
      after it (where the clocks jump forward), and `second_ms` is None.
    """

    kind: WallKind
    first_ms: int
    second_ms: int | None = None


def instant_ms(wall: datetime, offset: timedelta) -> int:
    """UTC epoch ms of the naive wall time `wall` read at UTC offset `offset`."""
    return (wall - offset - _EPOCH) // _MS


def local_at(at_ms: int, zone: ZoneInfo) -> datetime:
    """The aware local time at UTC epoch ms `at_ms`; `fold=1` on a wall time's second showing."""
    return (_EPOCH_UTC + at_ms * _MS).astimezone(zone)


def wall_at(at_ms: int, zone: ZoneInfo) -> datetime:
    """The naive wall time the clocks of `zone` show at UTC epoch ms `at_ms`."""
    return local_at(at_ms, zone).replace(tzinfo=None, fold=0)


def _offset(wall: datetime, zone: ZoneInfo, fold: int) -> timedelta:
    offset = zone.utcoffset(wall.replace(tzinfo=zone, fold=fold))
    if offset is None:  # a ZoneInfo always has an offset; this keeps the type exact
        raise ValueError(f"zone {zone.key!r} has no UTC offset at {wall.isoformat()}")
    return offset


def _offset_at(at_ms: int, zone: ZoneInfo) -> timedelta | None:
    return local_at(at_ms, zone).utcoffset()


def resolve(wall: datetime, zone: ZoneInfo) -> Resolved:
    """Map the naive wall time `wall` to its instants in `zone` (see `Resolved`).

    Follows PEP 495: `fold=0` reads a wall time at the offset in force before a transition,
    `fold=1` at the offset after it. Equal offsets mean one instant; a larger offset before
    means a fold; a larger offset after means a gap.
    """
    before, after = _offset(wall, zone, 0), _offset(wall, zone, 1)
    first_ms = instant_ms(wall, before)
    if before == after:
        return Resolved("unique", first_ms)
    if before > after:
        return Resolved("fold", first_ms, instant_ms(wall, after))
    return Resolved("gap", _transition_ms(zone, instant_ms(wall, after), first_ms, after))


def offset_change_ms(zone: ZoneInfo, lo_ms: int, hi_ms: int) -> int | None:
    """The first instant in (lo_ms, hi_ms] at which the UTC offset differs from the one at
    `lo_ms`, or None when it is the same at `hi_ms`. Assumes at most one change in the range
    (offsets change at most a few times a year; ranges here are at most days long)."""
    after = _offset_at(hi_ms, zone)
    if after is None or after == _offset_at(lo_ms, zone):
        return None
    return _transition_ms(zone, lo_ms, hi_ms, after)


def _transition_ms(zone: ZoneInfo, lo_ms: int, hi_ms: int, after: timedelta) -> int:
    """The first instant in (lo_ms, hi_ms] at offset `after`, by bisection on milliseconds.

    Invariant: the offset at `lo_ms` is not `after`, the offset at `hi_ms` is. Gaps and folds
    are at most a day wide, so this takes under 27 steps.
    """
    while hi_ms - lo_ms > 1:
        mid = (lo_ms + hi_ms) // 2
        if _offset_at(mid, zone) == after:
            hi_ms = mid
        else:
            lo_ms = mid
    return hi_ms


@dataclass(frozen=True, slots=True)
class Fold:
    """Wall times [start, end) that a zone shows twice: once before `transition_ms` (UTC epoch
    ms, where the clocks fall back), then again from it. Both bounds are naive wall times."""

    start: datetime
    end: datetime
    transition_ms: int

    def second_ms(self, wall: datetime) -> int:
        """UTC epoch ms of the second showing of `wall`, a wall time in [start, end)."""
        return self.transition_ms + (wall - self.start) // _MS


def fold_of(wall: datetime, zone: ZoneInfo) -> Fold | None:
    """The fold `wall` is in, or None when `wall` occurs at most once."""
    resolved = resolve(wall, zone)
    if resolved.second_ms is None:
        return None
    after = _offset(wall, zone, 1)
    transition_ms = _transition_ms(zone, resolved.first_ms, resolved.second_ms, after)
    start = wall_at(transition_ms, zone)
    return Fold(start, start + (resolved.second_ms - resolved.first_ms) * _MS, transition_ms)
