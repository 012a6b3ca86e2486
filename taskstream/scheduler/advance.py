"""Deciding the due fire times of one task: catch-up for ticks whose window closed while no
scheduler ran, `decide_tick` for the rest, ticks that wait (dependencies, deferral, an open
upstream breaker) kept until they are final, and every decision recorded with the values it saw.

A tick held back by an open breaker (`hold`) whose window closes while it waits goes to
catch-up with the other late ticks, so the task's catch-up policy decides it.

The task's cursor (last fire time fully decided), every decision and every instance made for
a fire time are written with the leader's fencing token; a rejected write means another
scheduler leads now and raises `Fenced`. A new leader raises every cursor's token to its own
before its first pass (`Store.claim_cursors`), so an old leader still in a pass records and
creates nothing after that.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from taskstream.core.errors import QueueUnavailable
from taskstream.core.logging import get_logger
from taskstream.core.outbox import Outbox
from taskstream.core.preconditions import Check
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import Store
from taskstream.scheduler.catchup import (
    Backlog,
    backlog_after,
    bound_missed,
    catchup_horizon_ms,
    newer_on_time,
    plan_catchup,
)
from taskstream.scheduler.decide import decide_tick
from taskstream.scheduler.emit import created_earlier, decisions_after, own_unrecorded
from taskstream.scheduler.facts import tick_facts
from taskstream.scheduler.hold import UpstreamHolds, hold_back, hold_until, late_when_closed
from taskstream.scheduler.leader import Fenced
from taskstream.scheduler.recall import TaskState, recall, summarised_until
from taskstream.scheduler.tick_writer import TickWriter
from taskstream.scheduler.ticks import Trigger, fire_times, is_fire_time, next_fire
from taskstream.scheduler.verdict import SKIP_WINDOW, Decision, decided_late, waits_for_maintenance

MAX_TICKS_PER_PASS = 1000
"""Bound on fire times one pass decides per task; older ones wait for the next pass."""
MISSED_ROWS = 100
"""Missed fire times recorded one by one before an outage is summarised instead."""


class Advancer:
    """Decides ticks for every task; one per scheduler process. Without `holds`, no tick is
    held back for its upstreams."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        checks: dict[str, Check],
        holds: UpstreamHolds | None = None,
    ) -> None:
        self._store, self._checks, self._holds = store, checks, holds
        self._states: dict[str, TaskState] = {}
        self._idle: set[str] = set()
        """Tasks without a schedule that have no tick left waiting (see `unscheduled`)."""
        self._log = get_logger(role="scheduler")
        self._writer = TickWriter(store, outbox, self._log)

    def forget(self) -> None:
        """Drop cached cursors (another scheduler may have moved them)."""
        self._states.clear()
        self._idle.clear()

    async def advance(
        self,
        spec: TaskSpec,
        trigger: Trigger,
        now_ms: int,
        token: int | None,
        *,
        since_ms: int | None = None,
    ) -> int:
        """Decide every due tick of `spec`; returns its next fire time (ms). `since_ms`: when
        its schedule took effect; its fire times before that are not its ticks (the schedule
        was edited after the cursor), though ticks that already wait stay due."""
        self._writer.token = token
        self._idle.discard(spec.id)
        state = self._states.setdefault(spec.id, TaskState())
        cursor = await self._cursor(spec, state, now_ms, token)
        await self._close_orphans(spec, trigger, now_ms, state)
        if since_ms is not None:
            cursor = max(cursor, since_ms - 1)
        cursor = await self._beyond_horizon(spec, trigger, cursor, now_ms, state)
        # Ticks decided or waiting past the cursor (it stays behind a waiting tick) do not count
        # against the bound, or ticks waiting for long would stop every later tick from being
        # decided, and the next wake-up would be one already past.
        limit = MAX_TICKS_PER_PASS + len(state.decided) + len(state.waiting)
        listed = fire_times(trigger, cursor, now_ms, limit=limit)
        fires = sorted(f for f in state.waiting if f <= cursor) + listed
        due = [f for f in fires if f not in state.decided]
        held = await self._held_by(spec, now_ms) if due else {}
        window_ms = round(spec.window * 1000)
        closed = [
            f for f in due if f + window_ms < now_ms and late_when_closed(state.waiting.get(f))
        ]
        if closed:
            more = len(listed) == limit
            later = backlog_after(trigger, listed[-1], now_ms, spec) if more else Backlog()
            # An older tick still waiting for its marker is not a newer tick on time.
            on_time = sorted(f for f in set(due) - set(closed) if f > closed[-1])
            newer = newer_on_time(spec, on_time, later)
            await self._catch_up(spec, closed, now_ms, state, held, newer, later.missed_ms)
        for fire in sorted(set(due) - set(closed)):
            previous = state.waiting.get(fire)
            late = decided_late(previous)
            decision = await self._decide(spec, fire, now_ms, held, catchup=late, previous=previous)
            await self._writer.settle(spec, fire, decision, now_ms, state)
        last = due[-1] if due else cursor
        await self._move(spec, state, min([last, *(f - 1 for f in state.waiting)]), token)
        wake = [d.until_ms for d in state.waiting.values() if d.until_ms is not None]
        # Past every tick decided so far, even those the cursor has not passed yet (a waiting
        # tick holds it back, or its write failed): a wake-up in the past would spin.
        return min([next_fire(trigger, max([last, cursor, *state.decided])), *wake])

    async def unscheduled(self, spec: TaskSpec, now_ms: int, token: int | None) -> None:
        """A task without a schedule (removed by an apply) decides no ticks; those it left
        waiting are closed as `skip_window`, or they would wait in its record for ever. Read
        once per task and process: a task never scheduled has no cursor and costs one read."""
        if spec.id in self._idle:
            return
        self._writer.token = token
        state = self._states.setdefault(spec.id, TaskState())
        await self._recall(spec, state)
        if state.cursor is not None and state.waiting:
            last = max(state.waiting)
            await self._close_orphans(spec, None, now_ms, state)
            await self._move(spec, state, max(state.cursor, last), token)
        self._idle.add(spec.id)

    async def _close_orphans(
        self, spec: TaskSpec, trigger: Trigger | None, now_ms: int, state: TaskState
    ) -> None:
        """Waiting ticks the schedule no longer fires at (it was edited, or removed: no
        `trigger`, while they waited) are closed as `skip_window`: nothing else would decide
        them again, and their wake-up would stay in the past."""
        if trigger is None:
            reason = "the task no longer has a schedule (removed while the tick waited)"
        else:
            reason = "the schedule no longer fires at this time (edited while the tick waited)"
        for fire in sorted(state.waiting):
            if trigger is None or not is_fire_time(trigger, fire):
                await self._writer.apply(spec, fire, Decision(SKIP_WINDOW, reason), now_ms, state)

    async def _catch_up(
        self,
        spec: TaskSpec,
        closed: list[int],
        now_ms: int,
        state: TaskState,
        held: Mapping[str, int],
        newer_on_time: int | None,
        later_ms: list[int],
    ) -> None:
        """Ticks whose window closed before anyone decided them, or while an open breaker held
        them back, follow the catch-up policy (`plan_catchup` says what the arguments mean)."""
        waits = {f: d for f, d in state.waiting.items() if waits_for_maintenance(d)}
        starts = {f: d.until_ms for f, d in waits.items() if d.until_ms is not None}
        plan = plan_catchup(
            closed, now_ms, spec, newer_on_time=newer_on_time, later_ms=later_ms, starts_held=starts
        )
        # Selected ticks too: deciding one again may now run nothing (a failed precondition,
        # an overlap), though a pass created its instance before it could record that.
        fresh = [f for f, _ in plan.entries if f not in state.emitted]
        own = await own_unrecorded(self._store, spec, fresh)
        for fire, planned in plan.entries:
            decision = planned
            if fire in own:
                await self._writer.done(spec, fire, created_earlier(fire), own[fire], now_ms, state)
                continue
            if planned.runs:
                decision = await self._decide(
                    spec, fire, now_ms, held, catchup=True, previous=waits.get(fire)
                )
            await self._writer.apply(spec, fire, decision, now_ms, state)

    async def _recall(self, spec: TaskSpec, state: TaskState) -> None:
        """The stored cursor, and the decisions past it, unless this process has them."""
        if state.cursor is None:
            state.cursor = await self._store.get_cursor(spec.id)
            if state.cursor is not None:
                rows = await decisions_after(self._store, spec.id, state.cursor)
                state.decided, state.waiting = recall(rows)
                state.summarised = summarised_until(rows)

    async def _cursor(
        self, spec: TaskSpec, state: TaskState, now_ms: int, token: int | None
    ) -> int:
        await self._recall(spec, state)
        if state.cursor is None:
            await self._move(spec, state, now_ms - 1, token)
        return state.cursor if state.cursor is not None else now_ms - 1

    async def _move(self, spec: TaskSpec, state: TaskState, cursor: int, token: int | None) -> None:
        if cursor == state.cursor:
            return
        if not await self._store.set_cursor(spec.id, cursor, token=token):
            raise Fenced.refused("cursor", spec.id)
        state.cursor = cursor
        state.decided = {f for f in state.decided if f > cursor}
        state.emitted = {f: done for f, done in state.emitted.items() if f > cursor}

    async def _beyond_horizon(
        self, spec: TaskSpec, trigger: Trigger, cursor: int, now_ms: int, state: TaskState
    ) -> int:
        """Fire times older than the catch-up horizon are `missed`. Up to `MISSED_ROWS` of
        them are decided one by one (each leaves a SKIPPED instance); more than that (a long
        outage) are summarised in one record, named after the first after those decided, and
        skipped over (once: a pass that failed before moving the cursor left the summary in
        `state.summarised`). Decided first: waiting ticks among them (`_end_waits`: else they would
        hold the cursor back, with no final decision), and ticks whose own instance a pass
        made before it stopped (`created_earlier`: they ran, and are not to be called missed)."""
        horizon = catchup_horizon_ms(spec, now_ms)
        old = fire_times(trigger, cursor, horizon - 1, limit=MISSED_ROWS + 1)
        if len(old) <= MISSED_ROWS:
            return cursor
        await self._end_waits(spec, sorted(f for f in state.waiting if f < horizon), now_ms, state)
        first = _first_undecided(
            trigger, max(cursor, state.summarised or cursor), horizon, state.decided
        )
        while first is not None:
            ran = await own_unrecorded(self._store, spec, [first])
            if first not in ran:
                break
            await self._writer.done(spec, first, created_earlier(first), ran[first], now_ms, state)
            first = _first_undecided(trigger, first, horizon, state.decided)
        if first is not None:  # else every fire time before the horizon has its decision
            await self._writer.record(
                spec, first, bound_missed(first, horizon - 1, None), None, now_ms
            )
            state.decided.add(first)  # a pass that fails before moving on records it once
            state.summarised = horizon - 1
        state.waiting = {f: d for f, d in state.waiting.items() if f >= horizon}
        return horizon - 1

    async def _end_waits(
        self, spec: TaskSpec, fires: list[int], now_ms: int, state: TaskState
    ) -> None:
        """Decide waiting ticks that a long outage put past the catch-up horizon as their
        window's close would have: late ones (held for maintenance or a breaker) `missed`,
        the others by their own rules (`skip_dep`, `skip_window`)."""
        held = await self._held_by(spec, now_ms) if fires else {}
        for fire in fires:
            previous = state.waiting[fire]
            if late_when_closed(previous):
                decision = bound_missed(fire, fire, 1)
            else:
                late = decided_late(previous)
                decision = await self._decide(
                    spec, fire, now_ms, held, catchup=late, previous=previous
                )
            await self._writer.settle(spec, fire, decision, now_ms, state)

    async def _held_by(self, spec: TaskSpec, now_ms: int) -> dict[str, int]:
        """The upstreams of `spec` whose breaker is open now, each with the instant (ms) its
        cool-down ends. When the breakers cannot be read nothing is held: executors still
        check every call against them."""
        if self._holds is None or not spec.upstreams:
            return {}
        try:
            left = await self._holds.held(spec.upstreams)
        except QueueUnavailable as exc:
            self._log.warning("upstream.breakers_unread", task_id=spec.id, error=str(exc)[:300])
            return {}
        return hold_until(left, now_ms)

    async def _decide(
        self,
        spec: TaskSpec,
        fire_ms: int,
        now_ms: int,
        held: Mapping[str, int],
        *,
        catchup: bool = False,
        previous: Decision | None = None,
    ) -> Decision:
        facts = await tick_facts(
            self._store, self._checks, spec, fire_ms, catchup=catchup, previous=previous
        )
        return hold_back(decide_tick(facts, spec, now_ms), held)


def _first_undecided(
    trigger: Trigger, after_ms: int, horizon_ms: int, decided: Set[int]
) -> int | None:
    """The first fire time after `after_ms` and before `horizon_ms` with no decision yet, read
    `MAX_TICKS_PER_PASS` at a time; None when there is none."""
    while True:
        page = fire_times(trigger, after_ms, horizon_ms - 1, limit=MAX_TICKS_PER_PASS)
        found = next((f for f in page if f not in decided), None)
        if found is not None or len(page) < MAX_TICKS_PER_PASS:
            return found
        after_ms = page[-1]
