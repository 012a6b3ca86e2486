"""Durations as float seconds, parsed from numbers or compact strings.

Accepted forms:

- a number of seconds, int or float, finite and >= 0 (`30`, `0.5`);
- a string of one or more `<number><unit>` parts, units in strictly descending order and each
  at most once: `250ms`, `30s`, `5m`, `1.5h`, `2d`, `1h30m`, `1d 2h`. Units: `d` (86 400 s),
  `h` (3 600 s), `m` (60 s), `s`, `ms` (0.001 s). A bare number string (`"30"`) is seconds.

Booleans, negative values, NaN and infinity are rejected. `Duration` is the pydantic field type
that applies `parse_duration` and caps it at `MAX_SECONDS`; `PositiveDuration` additionally
requires at least one millisecond (durations are kept as whole milliseconds downstream).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Final

from pydantic import AfterValidator, BeforeValidator, Field

UNIT_SECONDS: Final[dict[str, float]] = {
    "d": 86_400.0,
    "h": 3_600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
"""Seconds per unit, largest first; the order is the required order inside one string."""

_UNIT_RANK: Final = {unit: rank for rank, unit in enumerate(UNIT_SECONDS)}
_PART: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")
_BARE_NUMBER: Final = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(value: object) -> float:
    """Return `value` as seconds (float >= 0).

    Raises ValueError naming the offending text for negatives, empty strings, unknown units,
    repeated or out-of-order units and non-numeric input.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"invalid duration {value!r}: expected seconds or a string like '30s'")
    if isinstance(value, str):
        return _parse_text(value)
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float; its digits would swamp the message
        raise ValueError("invalid duration: the number is too large (at most 3650d)") from None
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: must be a finite number of seconds")
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must not be negative")
    return seconds


def _parse_text(text: str) -> float:
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"invalid duration {text!r}: empty")
    if stripped.startswith("-"):
        raise ValueError(f"invalid duration {text!r}: must not be negative")
    if _BARE_NUMBER.fullmatch(stripped):
        return float(stripped)
    total = 0.0
    last_rank = -1
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"invalid duration {text!r}: cannot read {stripped[pos:]!r}")
        number, unit = match.group(1), match.group(2).lower()
        rank = _UNIT_RANK.get(unit)
        if rank is None:
            raise ValueError(f"invalid duration {text!r}: {_unit_problem(number, unit)}")
        if rank <= last_rank:
            raise ValueError(
                f"invalid duration {text!r}: units must appear once each, largest first"
            )
        total += float(number) * UNIT_SECONDS[unit]
        last_rank = rank
        pos = match.end()
    return total


def _unit_problem(number: str, unit: str) -> str:
    known = ", ".join(UNIT_SECONDS)
    if not unit:
        # `1h30`: only a number standing alone means seconds.
        return f"{number} has no unit (use {known}, e.g. 1h30m; only a lone number is seconds)"
    return f"unknown unit {unit!r} (use {known})"


MAX_SECONDS: Final = 3650 * 86_400.0
"""The longest duration a task file may give (3650d, about ten years): every duration ends up
added to an epoch-millisecond time in a BIGINT column, and none is useful beyond this."""


def _capped(seconds: float) -> float:
    if seconds > MAX_SECONDS:
        raise ValueError(f"duration of {seconds:g} s is too long: at most 3650d")
    return seconds


def _positive(seconds: float) -> float:
    if seconds < 0.001:
        raise ValueError(f"duration of {seconds:g} s is too short: at least 1ms")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration), AfterValidator(_capped)]
"""Field type: float seconds from 0 to `MAX_SECONDS`, accepting every form `parse_duration`
accepts."""

PositiveDuration = Annotated[
    float,
    BeforeValidator(parse_duration),
    Field(gt=0),
    AfterValidator(_capped),
    AfterValidator(_positive),
]
"""Field type: float seconds from 1 ms to `MAX_SECONDS`."""

MIN_LEASE_S: Final = 1.0
"""The shortest claim lease a task may ask for (s). An executor extends its leases every third
of the shortest it holds but at most every 0.2 s, and a store write takes its own time: a
shorter lease could lapse while its run is healthy, which would then run a second time."""


def _lease(seconds: float) -> float:
    if seconds < MIN_LEASE_S:
        raise ValueError(
            f"lease of {seconds:g} s is too short: at least {MIN_LEASE_S:g}s, since leases are"
            " extended at most every 0.2 s"
        )
    return seconds


LeaseDuration = Annotated[PositiveDuration, AfterValidator(_lease)]
"""Field type: a claim lease, float seconds from `MIN_LEASE_S` to `MAX_SECONDS`."""
