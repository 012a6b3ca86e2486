"""Validation of a task's cron expression (pure): five fields, or six with seconds first, that
croniter reads as written and that fire at least once. croniter's own readings that would make
schedulers disagree (`R`, `H`) or run every value of a field (a range of one value) are refused
or rewritten here, so every scheduler and every pass computes the same fire times."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from croniter import CroniterBadDateError, CroniterError, croniter

_CRON_PROBE_START: Final = datetime(2000, 1, 1, tzinfo=UTC)
_CRON_REASON_PREFIX: Final = re.compile(r"^\[[^\]]*\]\s*(?:is\s+)?")
_CRON_ONE_VALUE_RANGE: Final = re.compile(r"^(\w+)-(\w+)(/\d+)?$")
"""A range part (`9-9`, `MON-MON`, `9-9/2`) that may name one value only."""
_CRON_DRAWN: Final = re.compile(r"^([hr])(\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
"""croniter's `R` and `H` (`R`, `R(0-29)`, `H/15`): a value drawn at random at every reading,
or from a hash of an id the task file does not give."""
_CRON_NAMES: Final = {
    name: number
    for names, first in (
        ("sun mon tue wed thu fri sat", 0),
        ("jan feb mar apr may jun jul aug sep oct nov dec", 1),
    )
    for number, name in enumerate(names.split(), start=first)
}
"""Weekday (Sunday 0) and month (January 1) names, as croniter numbers them."""


def check_cron(expr: str) -> str:
    """Return `expr` with whitespace normalised when it is a cron that fires at least once.

    Five fields (minute first) or six with seconds first (`0 0 9 * * *` is 09:00:00 daily).
    """
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            f"invalid cron expression {expr!r}: expected 5 fields, or 6 with seconds first "
            f"(got {len(fields)})"
        )
    parts = [field.split(",") for field in fields]
    for part in (part for field in parts for part in field):
        if (drawn := _CRON_DRAWN.match(part)) is None:
            continue
        what = "a random value" if drawn[1].lower() == "r" else "a hashed value"
        raise ValueError(
            f"invalid cron expression {expr!r}: {part!r} ({what}) is not supported, since"
            " every scheduler and every pass must compute the same fire times; write the"
            " value itself"
        )
    normal = " ".join(",".join(_one_value(part) for part in field) for field in parts)
    try:
        croniter(normal, _CRON_PROBE_START, second_at_beginning=True).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError(f"invalid cron expression {expr!r}: it never fires") from None
    except (CroniterError, ValueError, KeyError) as exc:
        reason = _CRON_REASON_PREFIX.sub("", str(exc)) or type(exc).__name__
        raise ValueError(f"invalid cron expression {expr!r}: {reason}") from None
    return normal


def _one_value(part: str) -> str:
    """`part` of a cron field, with a range of one value (`9-9`, `MON-MON`, `MON-1`, `9-9/2`)
    written as that value: croniter reads such a range as `*`, every value of the field."""
    found = _CRON_ONE_VALUE_RANGE.match(part)
    if found is None:
        return part
    low, high = found[1], found[2]
    low_n, high_n = _cron_number(low), _cron_number(high)
    same = low_n == high_n if low_n is not None else low.lower() == high.lower()
    return low if same else part


def _cron_number(text: str) -> int | None:
    """The number a cron value stands for (`09` and `9`: 9; `MON`: 1; `JAN`: 1), or None for
    anything else (`L`). Month and weekday names differ, so one table serves both fields."""
    if text.isascii() and text.isdigit():
        return int(text)
    return _CRON_NAMES.get(text.lower())
