"""Holding a tick back while an upstream's circuit breaker is open (pure; DESIGN.md §8).

While the breaker of an upstream that a task names is open, a tick that would run is not
turned into an instance: `hold_back` makes its `should_run` a non-final `deferred` with
`details["held_by"] = {upstream: until_ms}`, and the scheduler decides it again when the
earliest of those cool-downs ends. "Open" means open and still inside its cool-down: once the
cool-down has passed the executors' probes must be able to run, so the tick is released.
Half-open and closed breakers hold nothing back (executors still check admission per call).

A held tick is the same tick: same fire time, same dedupe key, and nothing is created while it
is held, so it fires at most once. While its window is open it is decided again like any
tick; once its window has closed it is a late tick, not a missed one, and the task's
`catchup` policy decides it like a tick the scheduler was down for (run, `coalesced`, or
`missed` past `max_delay` or with catch-up disabled). `released` marks the final decision of a
tick that was held (`details["held_back_by"]` and its reason), so the explain log says why it
ran late or not at all; likewise for a tick that waited for a maintenance window to end
(`details["waited_for_maintenance"]`).

All instants are UTC epoch milliseconds on the scheduler's clock; cool-downs arrive as
durations measured on the breakers' own clock, so the two clocks never need to agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final, Protocol

from taskstream.scheduler.verdict import DEFERRED, Decision, waits_for_maintenance

HELD_BY: Final = "held_by"
"""Detail key of a held tick: `{upstream: until_ms}`, the instant each cool-down ends."""
HELD_BACK_BY: Final = "held_back_by"
"""Detail key of the final decision of a tick that was held: the last `held_by` it saw."""
WAITED_FOR_MAINTENANCE: Final = "waited_for_maintenance"
"""Detail key of the final decision of a tick that waited for a maintenance window: the
window and the instant it ended (`maintenance`, `until_ms`)."""


class UpstreamHolds(Protocol):
    """The scheduler's view of the upstream circuit breakers (the composition root adapts the
    shared breakers to it)."""

    async def held(self, upstreams: Sequence[str]) -> Mapping[str, int]:
        """Of `upstreams`, those whose breaker is open and inside its cool-down, each with the
        time left until the cool-down ends (ms, > 0). Raises `QueueUnavailable` when the
        breakers cannot be read."""
        ...


def hold_until(left_ms: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """Cool-downs left (ms) as the instants they end on the scheduler's clock, by name. A
    re-check is always at least 1 ms away, so a held tick never spins."""
    return {name: now_ms + max(1, left) for name, left in sorted(left_ms.items())}


def hold_back(decision: Decision, held_by: Mapping[str, int]) -> Decision:
    """`decision`, or a `deferred` in its place when it would run and `held_by` (upstream ->
    instant its cool-down ends) names any open breaker. The held tick is decided again at the
    earliest cool-down end; every value `decision` saw is kept."""
    if not decision.runs or not held_by:
        return decision
    names = sorted(held_by)
    details = {**decision.details, HELD_BY: {name: held_by[name] for name in names}}
    reason = f"upstream breaker open: {', '.join(names)}"
    return Decision(DEFERRED, reason, details, min(held_by.values()))


def is_held(decision: Decision | None) -> bool:
    """True for a tick held back by an open upstream breaker (not a `not_before` deferral)."""
    return decision is not None and decision.decision == DEFERRED and bool(held_upstreams(decision))


def held_upstreams(decision: Decision) -> tuple[str, ...]:
    """The upstreams whose open breaker holds `decision`'s tick, sorted; () when none."""
    held = decision.details.get(HELD_BY)
    return tuple(sorted(held)) if isinstance(held, Mapping) else ()


def released(previous: Decision | None, decision: Decision) -> Decision:
    """The final `decision` of a tick whose `previous` decision held it back (an open breaker,
    a maintenance window), saying so; any other decision unchanged."""
    if previous is None or not decision.final:
        return decision
    if waits_for_maintenance(previous):
        waited = {
            "maintenance": previous.details["calendar"]["maintenance"],
            "until_ms": previous.until_ms,
        }
        reason = f"{decision.reason} (after waiting for maintenance window {waited['maintenance']})"
        details = {**decision.details, WAITED_FOR_MAINTENANCE: waited}
        return replace(decision, reason=reason, details=details)
    if not is_held(previous):
        return decision
    names = ", ".join(held_upstreams(previous))
    details = {**decision.details, HELD_BACK_BY: dict(previous.details[HELD_BY])}
    reason = f"{decision.reason} (after being held back by the open breaker of {names})"
    return replace(decision, reason=reason, details=details)


def late_when_closed(waiting: Decision | None) -> bool:
    """Whether a tick whose window has closed goes to catch-up: one nobody decided yet, or one
    that waited for an open breaker or a maintenance window (not for its dependencies, nor for
    `not_before`, which decide it themselves)."""
    return waiting is None or is_held(waiting) or waits_for_maintenance(waiting)


def waits_for(decision: Decision) -> tuple[str, tuple[str, ...], bool]:
    """What a waiting tick waits for; it is recorded again only when this changes. A move
    between a maintenance window and another hold counts: a scheduler that starts later
    recalls the tick from its last record, and only a maintenance wait makes it late."""
    return decision.decision, held_upstreams(decision), waits_for_maintenance(decision)
