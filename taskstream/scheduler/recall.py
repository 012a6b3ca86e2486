"""What earlier passes decided after a task's cursor, rebuilt from the explain log (pure).

The cursor moves only past ticks that are fully decided, so a scheduler that starts deciding a
task (a restart, a new leader, a standby taking over) may find ticks after the cursor that
were already decided or are still waiting. Without this memory a waiting tick whose window
closed meanwhile would be taken for a late one and handed to catch-up, which may run it
without its dependency; a decided one would be decided, and recorded, a second time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskstream.core.store.port import DecisionRow
from taskstream.scheduler.hold import HELD_BY
from taskstream.scheduler.verdict import DEFERRED, MISSED, NOT_FINAL, Decision, by_operator


@dataclass(slots=True)
class TaskState:
    """What one scheduler remembers about a task between passes."""

    cursor: int | None = None
    waiting: dict[int, Decision] = field(default_factory=dict)
    decided: set[int] = field(default_factory=set)
    """Ticks decided and recorded (kept until the cursor passes them)."""
    emitted: dict[int, tuple[Decision, str]] = field(default_factory=dict)
    """Ticks whose instance was emitted but whose decision is not recorded yet."""
    summarised: int | None = None
    """The last fire time (ms) a recorded `missed` summary of a long outage covers: the ticks
    up to it are decided by that one record, even while the cursor is still behind them."""


def recall(rows: Sequence[DecisionRow]) -> tuple[set[int], dict[int, Decision]]:
    """(fire times decided, fire time -> waiting decision) from `rows`, ordered by fire time
    then insertion: the latest row of each fire time counts. Rows of an operator's trigger or
    backfill at a tick's fire time are not the tick's decision and do not count."""
    latest: dict[int, DecisionRow] = {}
    for row in rows:
        if not by_operator(row.details):
            latest[row.fire_time_ms] = row
    decided: set[int] = set()
    waiting: dict[int, Decision] = {}
    for fire_ms, row in latest.items():
        if row.decision in NOT_FINAL:
            details = dict(row.details)
            waiting[fire_ms] = Decision(row.decision, row.reason, details, _until_ms(row))
        else:
            decided.add(fire_ms)
    return decided, waiting


def summarised_until(rows: Sequence[DecisionRow]) -> int | None:
    """The last fire time (ms) covered by a `missed` summary of a long outage among `rows`
    (`catchup.bound_missed` with no count: its `last_fire_ms`), or None when there is none.
    A waiting tick ended as missed (a count of 1) stands for itself only."""
    ends = [
        int(row.details["last_fire_ms"])
        for row in rows
        if row.decision == MISSED
        and row.details.get("count") is None
        and isinstance(row.details.get("last_fire_ms"), int)
    ]
    return max(ends, default=None)


def _until_ms(row: DecisionRow) -> int | None:
    """When the waiting tick is to be decided again, as its decision set it: the earliest
    cool-down end of a breaker hold, a deferral's held start, or a wait's window close."""
    details: Mapping[str, Any] = row.details
    held = details.get(HELD_BY)
    if isinstance(held, Mapping) and held:
        return min(int(v) for v in held.values())
    # A not_before / off_peak hold keeps its start in "deferral", a maintenance one in "calendar".
    deferral = details.get("deferral") or details.get("calendar")
    if row.decision == DEFERRED and isinstance(deferral, Mapping):
        until = deferral.get("until_ms")
        return int(until) if isinstance(until, int) else None
    until = details.get("open_until_ms")
    return int(until) if isinstance(until, int) else None
