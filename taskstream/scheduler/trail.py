"""Reading back what the scheduler decided, for `taskstream explain` (DESIGN.md §7): the
decision trail of one tick, the decided fire time nearest to an instant, and the rule behind
each recorded decision with the values it saw. Read-only; instants are UTC epoch ms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from taskstream.core.store.port import DecisionRow, Store
from taskstream.scheduler import verdict
from taskstream.scheduler.hold import HELD_BY
from taskstream.scheduler.recall import summarised_until

_TRAIL_LIMIT: Final = 1000
"""Most decision rows read for one tick."""
_DEP_VALUES: Final = ("depends_on", "markers_missing", "preconditions")
_RULE_VALUES: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    verdict.SKIP_WINDOW: ("window", ("late_ms", "window_ms", "open_until_ms", "deferral")),
    verdict.MISSED: (
        "window / catch-up",
        ("late_ms", "window_ms", "max_delay_ms", "catchup_enabled", "count", "first_fire_ms"),
    ),
    verdict.SKIP_CALENDAR: ("calendar", ("calendar",)),
    verdict.DEFERRED: ("not_before / off_peak", ("deferral",)),
    verdict.SKIP_OVERLAP: ("overlap", ("overlap",)),
    verdict.SKIP_DEP: ("dependencies", _DEP_VALUES),
    verdict.WAIT_DEP: ("dependencies", _DEP_VALUES),
    verdict.SKIP_DUPLICATED: ("dedupe", ("dedupe_key", "existing_status")),
    verdict.COALESCED: ("catch-up", ("mode", "coalesced_into_ms", "max_burst", "oldest_run_ms")),
}
"""The rule behind each decision name and the detail keys holding the values it saw."""


async def _first_at_or_after(store: Store, task_id: str, at_ms: int) -> int | None:
    rows = await store.decisions(task_id, since_ms=at_ms, limit=1)
    return rows[0].fire_time_ms if rows else None


async def _latest_before(store: Store, task_id: str, at_ms: int) -> int | None:
    """The latest decided fire time before `at_ms`: widen the look-back (doubling from 1 s)
    until one shows up, then bisect; O(log distance) queries."""
    span_ms, found = 1000, None
    while found is None:
        first = await _first_at_or_after(store, task_id, at_ms - span_ms)
        if first is not None and first < at_ms:
            found = first
        elif at_ms - span_ms < 0:
            return None
        span_ms *= 2
    low, high = found + 1, at_ms
    while low < high:
        mid = (low + high) // 2
        nxt = await _first_at_or_after(store, task_id, mid)
        if nxt is not None and nxt < at_ms:
            found, low = nxt, nxt + 1
        else:
            high = mid
    return found


async def nearest_decided_fire(store: Store, task_id: str, at_ms: int | None) -> int | None:
    """The decided fire time (ms) nearest to `at_ms` (the later one on a tie), or the latest
    decided one when `at_ms` is None; None when the task has no decisions.

    A fire time inside a long outage is decided by the one `missed` record that summarises
    it (`catchup.bound_missed`, recorded at the outage's first fire time): when the latest
    decided fire time before `at_ms` is such a record reaching `at_ms`, that one, however
    near a later decided fire time is."""
    if at_ms is None:
        latest = await store.decisions(task_id, limit=1)
        return latest[0].fire_time_ms if latest else None
    after = await _first_at_or_after(store, task_id, at_ms)
    if after == at_ms:
        return after
    before = await _latest_before(store, task_id, at_ms)
    if before is not None and await _summary_reaches(store, task_id, before, at_ms):
        return before
    if before is None or (after is not None and after - at_ms <= at_ms - before):
        return after
    return before


async def _summary_reaches(store: Store, task_id: str, fire_ms: int, at_ms: int) -> bool:
    """Whether a decision at `fire_ms` is the `missed` summary of a long outage whose fire
    times run on to `at_ms` or later (both ms)."""
    last_ms = summarised_until(await decision_trail(store, task_id, fire_ms))
    return last_ms is not None and last_ms >= at_ms


async def decision_trail(store: Store, task_id: str, fire_ms: int | None) -> list[DecisionRow]:
    """Every decision recorded for one fire time (ms) of `task_id`, oldest first (none for
    None)."""
    if fire_ms is None:
        return []
    rows = await store.decisions(task_id, since_ms=fire_ms, limit=_TRAIL_LIMIT)
    return [row for row in rows if row.fire_time_ms == fire_ms]


def rule_of(decision: str, details: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The rule behind a recorded decision and the values it saw (a subset of `details`):
    `("calendar (weekend)", {"calendar": {...}})`. `(None, {})` for `should_run`."""
    rule, keys = _RULE_VALUES.get(decision, (None, ()))
    saw = {key: details[key] for key in keys if key in details}
    calendar = details.get("calendar")
    if decision == verdict.SKIP_CALENDAR and isinstance(calendar, Mapping):
        rule = f"calendar ({calendar.get('rule')})"
    elif decision == verdict.SKIP_WINDOW and details.get("deferral"):
        rule = "not_before / off_peak (start held past the window)"
    elif decision == verdict.DEFERRED and isinstance(calendar, Mapping):
        rule, saw = "calendar (maintenance: start held until its end)", {"calendar": calendar}
    elif decision == verdict.DEFERRED and details.get(HELD_BY):
        rule, saw = "upstream breaker (open)", {HELD_BY: details[HELD_BY]}
    return rule, saw
