"""Trigger decision for one tick (pure). Decision names, `Decision` and `TickFacts` are in
`verdict`, the explain log's vocabulary (DESIGN.md §7).

`decide_tick` evaluates the rules in this order and reports the first one that stops the tick:

1. window: the start must happen by `fire + window` (`skip_window`). A tick that was waiting
   for its dependencies (`previous == "wait_dep"`) and is still not ready when the window
   closes is `skip_dep` instead: the wait, not lateness, is why it never ran. A catch-up tick
   (admitted by `catchup.plan_catchup`) is bounded by `fire + max(window, catchup.max_delay)`
   and is `missed` past it.
2. calendar: the fire time, and the start instant when it is later, must not fall on a weekend
   (when disallowed), an excluded date or inside a maintenance window (`skip_calendar`). With
   catch-up enabled a maintenance window does not skip the tick: a start inside one is
   `deferred` to the window's end, as long as that end is within the catch-up reach
   (`fire + max(window, catchup.max_delay)`), else `skip_calendar`. Once its trigger window
   has closed, such a tick is a late one and the catch-up policy decides it with the others.
3. deferral: `not_before` / `off_peak` may hold the start (`deferred`, re-decide at `until_ms`)
   as long as the held start is still inside the window; else `skip_window`.
4. overlap with another still-active instance: `forbid` skips (`skip_overlap`), `allow`
   runs, `replace` runs with `details["replace"]` listing the instances the caller cancels
   (every earlier active one). `replace` only cancels earlier runs: when the active instance
   fires after this tick, the newer run is kept and this tick is `skip_overlap`.
5. dependencies: a failed precondition is `skip_dep`. Missing markers or unavailable checks wait
   (`wait_dep`, until the window closes: see 1); a catch-up tick checks them only under
   `catchup.only_if_ready` and is `skip_dep` at once when not ready.
6. otherwise `should_run`. Dedupe is the store's UNIQUE key: the caller turns a duplicate insert
   into `skip_duplicated`, and holds a `should_run` back (`deferred`) while a breaker of the
   task's upstreams is open (`hold.hold_back`).

All instants are UTC epoch milliseconds; `now_ms` is passed in. `start_ms = max(fire, now)` is
when a start decided now would happen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from taskstream.core.spec import TaskSpec
from taskstream.scheduler.calendar import (
    defer_until,
    local_iso,
    zone_of,
)
from taskstream.scheduler.maintenance import maintenance_hold, skipping_block
from taskstream.scheduler.verdict import (
    AFTER_MAINTENANCE,
    DEFERRED,
    MISSED,
    SHOULD_RUN,
    SKIP_CALENDAR,
    SKIP_DEP,
    SKIP_OVERLAP,
    SKIP_WINDOW,
    WAIT_DEP,
    Decision,
    TickFacts,
)

START_GRACE_MS: Final = 5_000
"""How long after its window closed a tick deferred to a start inside the window may still
start: the scheduler wakes at that start, a little after it."""


@dataclass(frozen=True, slots=True)
class _Tick:
    facts: TickFacts
    spec: TaskSpec
    now_ms: int
    open_until_ms: int

    @property
    def start_ms(self) -> int:
        return max(self.facts.fire_ms, self.now_ms)

    @property
    def closed(self) -> bool:
        return self.now_ms > self.open_until_ms


@dataclass(frozen=True, slots=True)
class _Step:
    """One rule's outcome: the values it saw, and a decision when it stops the tick."""

    seen: dict[str, Any]
    decision: str | None = None
    reason: str = ""
    until_ms: int | None = None


def decide_tick(facts: TickFacts, spec: TaskSpec, now_ms: int) -> Decision:
    """Decide one tick of `spec` at `now_ms` (UTC epoch ms); see the module docstring for the
    order. `details` holds every value each evaluated rule saw."""
    tick = _Tick(facts, spec, now_ms, _open_until_ms(facts, spec))
    seen = _base_details(tick)
    for rule in _RULES:
        step = rule(tick)
        seen.update(step.seen)
        if step.decision is not None:
            return Decision(step.decision, step.reason, seen, step.until_ms)
    active = facts.active_instance
    if active is not None and spec.concurrency == "replace":
        replaced = list(facts.earlier_active)
        seen["replace"] = replaced
        return Decision(SHOULD_RUN, f"every rule passed; replaces {', '.join(replaced)}", seen)
    return Decision(SHOULD_RUN, "every rule passed", seen)


def catchup_reach_ms(spec: TaskSpec) -> int:
    """How long (ms) after its fire time a tick may still start once catch-up admits it (or
    a maintenance window holds it): the larger of `window` and `catchup.max_delay`."""
    return round(max(spec.window, spec.catchup.max_delay) * 1000)


def held_start_due(until_ms: int | None, open_until_ms: int, now_ms: int) -> bool:
    """A start held until `until_ms` (ms; None: not held), inside a window open until
    `open_until_ms`, decided again at `now_ms`: due from the held start on, even a little past
    the window's close (the scheduler wakes after the held start), within `START_GRACE_MS`."""
    if until_ms is None or until_ms > open_until_ms:
        return False
    return until_ms <= now_ms <= open_until_ms + START_GRACE_MS


def _open_until_ms(facts: TickFacts, spec: TaskSpec) -> int:
    reach_ms = catchup_reach_ms(spec) if facts.catchup else round(spec.window * 1000)
    return facts.fire_ms + reach_ms


def _base_details(tick: _Tick) -> dict[str, Any]:
    zone = zone_of(tick.spec.timezone)
    fire_ms = tick.facts.fire_ms
    return {
        "fire_time_ms": fire_ms,
        "now_ms": tick.now_ms,
        "timezone": str(zone),
        "fire_local": local_iso(fire_ms, zone),
        "now_local": local_iso(tick.now_ms, zone),
        "late_ms": max(0, tick.now_ms - fire_ms),
        "window_ms": round(tick.spec.window * 1000),
        "open_until_ms": tick.open_until_ms,
        "catchup": tick.facts.catchup,
        "previous": tick.facts.previous,
    } | ({AFTER_MAINTENANCE: True} if tick.facts.after_maintenance else {})


def _window(tick: _Tick) -> _Step:
    catchup = tick.spec.catchup
    if tick.facts.catchup:
        seen = {"max_delay_ms": round(catchup.max_delay * 1000), "catchup_enabled": catchup.enabled}
        if not catchup.enabled:
            return _Step(seen, MISSED, "catch-up is disabled")
        if tick.closed and not _held_start_due(tick):
            return _Step(seen, MISSED, "older than catchup.max_delay")
        return _Step(seen)
    if not tick.closed or _held_start_due(tick):
        return _Step({})
    late = tick.now_ms - tick.facts.fire_ms
    if tick.facts.previous == WAIT_DEP:
        readiness = _readiness(tick)
        if readiness.failed or readiness.waiting:
            names = ", ".join(readiness.failed + readiness.waiting)
            return _Step(readiness.seen, SKIP_DEP, f"window closed waiting for {names}")
    return _Step({}, SKIP_WINDOW, f"trigger window closed: late by {late} ms")


def _held_start_due(tick: _Tick) -> bool:
    """A tick deferred to a start inside its window, decided again at that start
    (`held_start_due`): a start held until the window's last instant (`not_before: 07:00` with
    a window ending at 07:00) still runs when the scheduler wakes a little after it."""
    facts = tick.facts
    if facts.previous != DEFERRED:
        return False
    return held_start_due(facts.previous_until_ms, tick.open_until_ms, tick.now_ms)


def _calendar(tick: _Tick) -> _Step:
    instants = [("fire", tick.facts.fire_ms)]
    if tick.start_ms != tick.facts.fire_ms:
        instants.append(("start", tick.start_ms))
    for label, at_ms in instants:
        block = skipping_block(tick.spec, at_ms)
        if block is not None:
            seen = {"calendar": {**block.details, "rule": block.rule, "checked": label}}
            return _Step(seen, SKIP_CALENDAR, f"calendar: {block.reason}")
    return _maintenance(tick)


def _maintenance(tick: _Tick) -> _Step:
    """A start inside a maintenance window waits for its end, within the catch-up reach."""
    reach_ms = tick.facts.fire_ms + catchup_reach_ms(tick.spec)
    hold = maintenance_hold(tick.spec, tick.start_ms, reach_ms)
    if hold is None:
        return _Step({"calendar": None})
    checked = "fire" if tick.start_ms == tick.facts.fire_ms else "start"
    held = hold.held
    seen = {"calendar": {**held.details, "rule": "maintenance", "checked": checked}}
    if hold.past_reach:
        reason = f"calendar: {held.reason}, which is past the catch-up reach (max_delay)"
        return _Step(seen, SKIP_CALENDAR, reason)
    return _Step(seen, DEFERRED, f"calendar: {held.reason}", held.until_ms)


def _deferral(tick: _Tick) -> _Step:
    held = defer_until(tick.spec, tick.start_ms)
    if held is None:
        return _Step({"deferral": None})
    seen = {"deferral": held.details}
    if held.until_ms is None:
        return _Step(seen, SKIP_WINDOW, held.reason)
    if held.until_ms > tick.open_until_ms:
        reason = f"{held.reason}, after the window closes"
        return _Step(seen, SKIP_WINDOW, reason)
    return _Step(seen, DEFERRED, held.reason, held.until_ms)


def _overlap(tick: _Tick) -> _Step:
    active, policy = tick.facts.active_instance, tick.spec.concurrency
    if active is None:
        return _Step({"overlap": None})
    overlap: dict[str, Any] = {
        "policy": policy,
        "active_id": active.id,
        "active_status": active.status,
    }
    seen = {"overlap": overlap}
    if policy == "forbid":
        return _Step(seen, SKIP_OVERLAP, f"{active.id} is still {active.status} (forbid)")
    newer = active.scheduled_for_ms is not None and active.scheduled_for_ms > tick.facts.fire_ms
    if policy == "replace" and newer:
        overlap["active_fire_ms"] = active.scheduled_for_ms
        reason = f"{active.id}, a later run, is still {active.status} (replace keeps the newest)"
        return _Step(seen, SKIP_OVERLAP, reason)
    return _Step(seen)


@dataclass(frozen=True, slots=True)
class _Readiness:
    seen: dict[str, Any]
    failed: list[str]
    waiting: list[str]


def _readiness(tick: _Tick) -> _Readiness:
    """Failed checks, and markers or checks not ready yet (a declared check with no result is
    `unavailable`), with the values seen."""
    facts, spec = tick.facts, tick.spec
    results: dict[str, str] = dict.fromkeys(spec.preconditions, "unavailable")
    results.update(facts.preconditions)
    seen: dict[str, Any] = {
        "depends_on": list(spec.depends_on),
        "markers_missing": list(facts.missing_markers),
        "preconditions": results,
    }
    failed = sorted(name for name, result in results.items() if result == "fail")
    unavailable = sorted(name for name, result in results.items() if result == "unavailable")
    return _Readiness(seen, failed, [*facts.missing_markers, *unavailable])


def readiness_checked(spec: TaskSpec, *, catchup: bool, after_maintenance: bool) -> bool:
    """Whether a tick's `depends_on` and `preconditions` are checked: always on time; for a
    catch-up tick under `only_if_ready`, or when it is late only for a maintenance wait."""
    return not catchup or spec.catchup.only_if_ready or after_maintenance


def _dependencies(tick: _Tick) -> _Step:
    facts = tick.facts
    if not readiness_checked(
        tick.spec, catchup=facts.catchup, after_maintenance=facts.after_maintenance
    ):
        return _Step({"dependencies_checked": False})
    ready = _readiness(tick)
    if ready.failed:
        return _Step(ready.seen, SKIP_DEP, f"preconditions failed: {', '.join(ready.failed)}")
    if not ready.waiting:
        return _Step(ready.seen)
    names = ", ".join(ready.waiting)
    if facts.after_maintenance:
        reason = f"{names} not ready once the maintenance window ended (the window had closed)"
        return _Step(ready.seen, SKIP_DEP, reason)
    if facts.catchup:
        return _Step(ready.seen, SKIP_DEP, f"catch-up needs readiness: {names} not ready")
    return _Step(ready.seen, WAIT_DEP, f"waiting for {names}", tick.open_until_ms)


_RULES: Final[tuple[Callable[[_Tick], _Step], ...]] = (
    _window,
    _calendar,
    _deferral,
    _overlap,
    _dependencies,
)
