"""Catch-up after downtime (pure): what happens to fire times whose trigger window closed
before the scheduler could decide them.

Each missed fire time gets one decision, checked in this order:

1. `catchup.enabled: false` -> `missed`.
2. older than `catchup.max_delay` (`now - fire > max_delay`) -> `missed`; the caller records
   it as a SKIPPED instance with reason `missed`.
3. the calendar forbids its fire time -> `skip_calendar` (so `latest` picks the newest tick
   that may run at all, not one the calendar would then drop; likewise a newer tick on time
   that the calendar skips is no tick to coalesce into, see `newer_on_time`). A maintenance
   window does not forbid it: with catch-up enabled a run waits for the window's end
   (`decide_tick` holds the start), so only weekends and excluded dates count here.
4. selection among the rest: `mode: latest` runs only the newest (with its own scheduled_for
   and business date) and marks the older ones `coalesced`; `mode: all` runs each, but at most
   `max_burst` of them: the newest `max_burst` run, the older excess is `coalesced`.

A `should_run` here is provisional: the caller decides each one again with
`decide_tick(TickFacts(fire_ms, catchup=True, ...), spec, now_ms)`, which applies the start
instant's calendar, deferral, overlap and, with `only_if_ready` (or for a tick late only for
a maintenance wait: `decide.readiness_checked`), dependencies: a catch-up tick that is not
ready is `skip_dep`, never waits.

Bounds: `plan_catchup` is O(n) in the fire times it is given and returns at most `max_burst`
(default 100) runs, so a week of per-minute ticks cannot flood the queue. The expensive part
is recording one row per tick; fire times before `catchup_horizon_ms` are `missed` whatever the
mode, so the caller need not enumerate them and may record one `bound_missed` summary for that
range instead. All instants are UTC epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from taskstream.core.spec import TaskSpec
from taskstream.scheduler.decide import catchup_reach_ms, held_start_due
from taskstream.scheduler.maintenance import skipping_block
from taskstream.scheduler.ticks import Trigger, fire_times
from taskstream.scheduler.verdict import COALESCED, MISSED, SHOULD_RUN, SKIP_CALENDAR, Decision

DEFAULT_MAX_BURST: Final = 100
"""Most catch-up runs of one backlog (per task), however many passes decide it."""


@dataclass(frozen=True, slots=True)
class CatchupPlan:
    """One decision per missed fire time, oldest first. The caller decides the `should_run`
    entries again with `decide_tick`, with the facts it gathers for them."""

    entries: tuple[tuple[int, Decision], ...]

    @property
    def runs(self) -> list[int]:
        """The fire times (ms) that run, oldest first; at most `max_burst` of them."""
        return [fire_ms for fire_ms, decision in self.entries if decision.runs]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def catchup_horizon_ms(spec: TaskSpec, now_ms: int) -> int:
    """The oldest fire time (ms) that can still start at `now_ms`, on time or by catch-up.

    Every earlier fire time is `missed` whatever the mode: `now - max(window, max_delay)`, or
    `now - window` when catch-up is disabled.
    """
    return now_ms - (catchup_reach_ms(spec) if spec.catchup.enabled else _ms(spec.window))


@dataclass(frozen=True, slots=True)
class Backlog:
    """What lies past one chunk of a backlog: its next `LATER_SCAN` missed fire times (ms,
    ascending) and the first tick after the chunk that is still on time (ms), if any."""

    missed_ms: list[int] = field(default_factory=list)
    on_time_ms: int | None = None


LATER_SCAN: Final = 1000
"""Missed fire times looked at past a chunk, to count the burst of the whole backlog."""


def backlog_after(trigger: Trigger, last_ms: int, now_ms: int, spec: TaskSpec) -> Backlog:
    """The rest of a backlog after the chunk ending at fire time `last_ms`: ticks whose window
    closed by `now_ms` are missed, newer ones on time (the first the calendar lets start)."""
    closes_by = now_ms - _ms(spec.window) - 1
    missed = fire_times(trigger, last_ms, closes_by, limit=LATER_SCAN)
    on_time = fire_times(trigger, max(last_ms, closes_by), now_ms, limit=LATER_SCAN)
    return Backlog(missed, newer_on_time(spec, on_time, Backlog()))


def newer_on_time(spec: TaskSpec, on_time_ms: Sequence[int], later: Backlog) -> int | None:
    """The newer tick on time that `latest` coalesces missed ticks into: the oldest of
    `on_time_ms` (ascending) whose fire time the calendar does not skip, else the one past
    the chunk (`later`). A tick the calendar skips runs nothing, so it stands for nothing."""
    allowed = (f for f in on_time_ms if skipping_block(spec, f) is None)
    return next(allowed, later.on_time_ms)


def bound_missed(first_ms: int, last_ms: int, count: int | None) -> Decision:
    """One `missed` decision standing for the fire times in `[first_ms, last_ms]` (ms), all
    before the catch-up horizon, that the caller chose not to enumerate; `count` of them, or
    None when counting them would mean enumerating them."""
    if last_ms < first_ms or (count is not None and count < 1):
        raise ValueError("need first_ms <= last_ms and count >= 1")
    details = {"first_fire_ms": first_ms, "last_fire_ms": last_ms, "count": count}
    many = "fire times" if count is None else f"{count} fire time(s)"
    return Decision(MISSED, f"{many} older than the catch-up horizon", details)


def plan_catchup(
    missed_ms: Sequence[int],
    now_ms: int,
    spec: TaskSpec,
    *,
    max_burst: int = DEFAULT_MAX_BURST,
    newer_on_time: int | None = None,
    later_ms: Sequence[int] = (),
    starts_held: Mapping[int, int] = MappingProxyType({}),
) -> CatchupPlan:
    """Decide every fire time in `missed_ms` (strictly ascending, each with its trigger window
    closed at `now_ms`) per `spec.catchup`; see the module docstring for the order. With
    `mode: latest` and `newer_on_time` (the fire time, ms, of a newer tick of the task that is
    still inside its window), none of them runs: they are all coalesced into that newer tick.

    `later_ms`: the missed fire times newer than these that later chunks of the same backlog
    decide (ascending; at least `max_burst` of them, when there are that many). The burst
    counts them: `latest` runs only the newest of the whole backlog, `all` its newest
    `max_burst`, however many chunks it takes.

    `starts_held`: fire time -> the instant (ms) a maintenance window held its start until.
    Such a tick is not `missed` once that start is due (`decide.held_start_due` within the
    catch-up reach, `fire + max(window, max_delay)`: the scheduler wakes a little after it).

    ValueError when `max_burst < 1`, the times are not ascending, or one is still on time.
    """
    _check_missed(missed_ms, now_ms, _ms(spec.window), max_burst)
    gates = [_gate(fire_ms, now_ms, spec, starts_held.get(fire_ms)) for fire_ms in missed_ms]
    eligible = [i for i, gate in enumerate(gates) if gate is None]
    later = [f for f in later_ms if _gate(f, now_ms, spec, starts_held.get(f)) is None]
    later = later[-max_burst:]
    latest = spec.catchup.mode == "latest"
    newer = newer_on_time is not None
    keep = (0 if newer or later else 1) if latest else max_burst - len(later)
    running = eligible[-keep:] if keep else []
    first_run = running[0] if running else len(missed_ms)
    into = _into(latest, [missed_ms[i] for i in running], later, newer_on_time=newer_on_time)
    entries: list[tuple[int, Decision]] = []
    for i, fire_ms in enumerate(missed_ms):
        decision = gates[i]
        if decision is None and i >= first_run:
            decision = _run(fire_ms, now_ms, spec)
        elif decision is None:
            seen = _seen(fire_ms, now_ms, spec)
            decision = Decision(COALESCED, into[0], seen | into[1])
        entries.append((fire_ms, decision))
    return CatchupPlan(tuple(entries))


def _into(
    latest: bool, running: list[int], later: list[int], *, newer_on_time: int | None
) -> tuple[str, dict[str, Any]]:
    """Why the ticks not run are coalesced, and into what (reason, details)."""
    if latest and running:
        into = running[-1]
        return f"coalesced into the newest missed tick {into}", {"coalesced_into_ms": into}
    if latest and newer_on_time is not None:
        reason = f"coalesced into the newer tick {newer_on_time}, which is on time"
        return reason, {"coalesced_into_ms": newer_on_time}
    if latest:
        return "coalesced into a newer missed tick, decided later in this backlog", {}
    burst = len(running) + len(later)
    oldest = (running or later or [0])[0]
    details = {"max_burst": burst, "oldest_run_ms": oldest}
    return f"over the catch-up burst: only the newest {burst} run", details


def _check_missed(missed_ms: Sequence[int], now_ms: int, window_ms: int, max_burst: int) -> None:
    if max_burst < 1:
        raise ValueError(f"max_burst must be >= 1, got {max_burst}")
    previous: int | None = None
    for fire_ms in missed_ms:
        if previous is not None and fire_ms <= previous:
            raise ValueError(f"fire times must be strictly ascending: {fire_ms} after {previous}")
        if now_ms <= fire_ms + window_ms:
            raise ValueError(f"fire time {fire_ms} is still on time: decide it with decide_tick")
        previous = fire_ms


def _seen(fire_ms: int, now_ms: int, spec: TaskSpec) -> dict[str, Any]:
    policy = spec.catchup
    return {
        "fire_time_ms": fire_ms,
        "now_ms": now_ms,
        "late_ms": now_ms - fire_ms,
        "catchup_enabled": policy.enabled,
        "max_delay_ms": _ms(policy.max_delay),
        "mode": policy.mode,
        "only_if_ready": policy.only_if_ready,
        "catchup": True,
    }


def _gate(fire_ms: int, now_ms: int, spec: TaskSpec, held_ms: int | None) -> Decision | None:
    """`missed` or `skip_calendar` for one fire time, or None when it may be selected."""
    policy, seen = spec.catchup, _seen(fire_ms, now_ms, spec)
    if not policy.enabled:
        return Decision(MISSED, "catch-up is disabled", seen)
    held_due = held_start_due(held_ms, fire_ms + catchup_reach_ms(spec), now_ms)
    if now_ms > fire_ms + _ms(policy.max_delay) and not held_due:
        late = now_ms - fire_ms
        return Decision(MISSED, f"late by {late} ms, older than catchup.max_delay", seen)
    block = skipping_block(spec, fire_ms)
    if block is not None:
        seen["calendar"] = {**block.details, "rule": block.rule, "checked": "fire"}
        return Decision(SKIP_CALENDAR, f"calendar: {block.reason}", seen)
    return None


def _run(fire_ms: int, now_ms: int, spec: TaskSpec) -> Decision:
    seen = _seen(fire_ms, now_ms, spec) | {"require_ready": spec.catchup.only_if_ready}
    return Decision(SHOULD_RUN, f"catch-up (mode {spec.catchup.mode})", seen)
