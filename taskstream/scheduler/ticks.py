"""Fire times of a schedule (pure). croniter is used here and nowhere else.

All instants are UTC epoch milliseconds. Cron expressions are evaluated in the task's IANA
timezone, never the host's. `every` intervals are aligned to the Unix epoch, so every
scheduler computes the same fire times (and so the same dedupe keys) without coordination.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from croniter import croniter


@dataclass(frozen=True, slots=True)
class Trigger:
    """A schedule reduced to what fire-time arithmetic needs. Exactly one of `cron`/`every_ms`."""

    cron: str | None = None
    timezone: str | None = None
    every_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise ValueError("a trigger has exactly one of cron or every_ms")
        if self.cron is not None and not self.timezone:
            raise ValueError("a cron trigger needs an IANA timezone")
        if self.every_ms is not None and self.every_ms <= 0:
            raise ValueError("every_ms must be positive")


def _cron(trigger: Trigger, after_ms: int) -> croniter:
    expr, tz = trigger.cron or "", trigger.timezone or "UTC"
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(ZoneInfo(tz))
    return croniter(expr, start, second_at_beginning=len(expr.split()) == 6)


def next_fire(trigger: Trigger, after_ms: int) -> int:
    """The first fire time strictly after `after_ms`."""
    if trigger.every_ms is not None:
        return (after_ms // trigger.every_ms + 1) * trigger.every_ms
    nxt: datetime = _cron(trigger, after_ms).get_next(datetime)
    return int(nxt.timestamp() * 1000)


def fire_times(trigger: Trigger, after_ms: int, until_ms: int, *, limit: int) -> list[int]:
    """Fire times in (after_ms, until_ms], oldest first, at most `limit` of them."""
    out: list[int] = []
    if trigger.every_ms is not None:
        t = next_fire(trigger, after_ms)
        while t <= until_ms and len(out) < limit:
            out.append(t)
            t += trigger.every_ms
        return out
    it = _cron(trigger, after_ms)
    while len(out) < limit:
        t = int(it.get_next(datetime).timestamp() * 1000)
        if t > until_ms:
            break
        out.append(t)
    return out
