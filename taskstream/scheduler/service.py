"""The scheduler loop: hold the leader lease (or stand by), reload definitions, re-emit due
retries, decide every due tick of every active task, then sleep until the next fire time
(capped so definition changes, waiting ticks and stop requests are seen). A tick whose task
names an upstream with an open circuit breaker is held back until the cool-down ends (`hold`).

Several schedulers may run: one leads, the others stand by and take over within the lease
when it dies. Correctness never depends on the lease: the store's UNIQUE dedupe key turns a
double fire into `skip_duplicated`, and cursor writes are fenced by the lease token.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.definitions import DefinitionCache
from taskstream.core.denials import log_denied, pause_s
from taskstream.core.errors import CommandDenied, StoreUnavailable
from taskstream.core.futures import STEP_END_S, unless_stopped
from taskstream.core.logging import get_logger
from taskstream.core.notify import SAFETY_WAKE_S, Wakeups
from taskstream.core.outbox import Outbox
from taskstream.core.preconditions import Check
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import Store
from taskstream.core.unreadable_rows import UnreadableRows
from taskstream.scheduler.advance import Advancer
from taskstream.scheduler.hold import UpstreamHolds
from taskstream.scheduler.instances import new_instance, on_demand, trigger_of
from taskstream.scheduler.leader import Fenced, LeaderLease
from taskstream.scheduler.ticks import Trigger

__all__ = ["Scheduler", "SchedulerConfig", "new_instance", "trigger_of"]

MAX_RETRIES_PER_PASS = 1000
ERROR_PAUSE_S = 1.0
REFUSED_RECHECK_S = 60.0
"""How soon a due retry that could not be published (no entry can be made of its row) is
offered again, at the latest: it stays due, and must not wake the scheduler at once for ever."""
LAPSE_MARGIN_MS = 5
"""How long after the holder's lease is due to lapse a standby tries to take it (ms)."""
TASKS_AT_ONCE = 32
"""Tasks decided concurrently in one pass, so ticks due together are published together."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """`max_sleep_s`: longest sleep between passes when no hint arrives (seconds); passes
    otherwise happen at the next fire time, retry or waiting tick, or on a hint."""

    max_sleep_s: float = SAFETY_WAKE_S


async def _sleep(stop: asyncio.Event, wakeups: Wakeups | None, wait_s: float) -> None:
    """Sleep `wait_s` seconds, ending early on `stop` or a control hint."""
    if wakeups is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait_s)
        return
    stopping = asyncio.create_task(stop.wait())
    hinted = asyncio.create_task(wakeups.wait(wait_s))
    await asyncio.wait({stopping, hinted}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopping, hinted):
        task.cancel()
    await asyncio.gather(stopping, hinted, return_exceptions=True)


class Scheduler:
    """One scheduler process. `holds` reads the upstream breakers; without it no tick is held
    back for its upstreams (executors still defer calls an open breaker refuses)."""

    def __init__(
        self,
        store: Store,
        outbox: Outbox,
        clock: Clock,
        config: SchedulerConfig,
        *,
        leader: LeaderLease | None = None,
        checks: dict[str, Check] | None = None,
        wakeups: Wakeups | None = None,
        holds: UpstreamHolds | None = None,
    ) -> None:
        self._wakeups = wakeups
        self._store, self._outbox, self._clock, self._config = store, outbox, clock, config
        self._leader = leader
        self._defs = DefinitionCache(store)
        self._checks = checks or {}
        self._advancer = Advancer(store, outbox, self._checks, holds)
        self._token: int | None = None
        self._refused_by: int | None = None
        """Set when the last pass offered every retry due by this time (ms) and some were
        refused: those due by then and still RETRYING are refused ones. None otherwise."""
        self._retries_after: tuple[int, str] | None = None
        """(next_attempt_at_ms, id) of the last row of the previous pass's full page of due
        retries, when refused ones were met since the first page: the next pass reads on."""
        self._refused_in_cycle = False
        """Some due retry was refused since the pages last started from the first."""
        self._renew_s = leader.lease_ms / 3000 if leader else config.max_sleep_s
        self._denials = 0
        """Steps in a row that Redis denied."""
        self._log = get_logger(role="scheduler", owner=leader.owner if leader else None)
        self._unreadable = UnreadableRows(self._log)

    async def run(self, stop: asyncio.Event) -> None:
        """Run passes while leading, stand by otherwise, until `stop` is set. Between passes
        it sleeps until the next due moment, or until a hint on the control channel."""
        self._log.info("scheduler.started")
        try:
            while not stop.is_set():
                wait_s = await unless_stopped(self._step(), stop)
                if wait_s is not None:
                    await _sleep(stop, self._wakeups, wait_s)
        finally:
            await self._let_go()
            self._log.info("scheduler.stopped")

    async def _let_go(self) -> None:
        """Leave the control channel and give the lease up, each given `STEP_END_S`: a Redis
        that stopped answering must not hold the stop up (the lease then lapses by itself)."""
        if self._wakeups is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeups.close(), timeout=STEP_END_S)
        if self._leader is not None:
            with contextlib.suppress(TimeoutError, *streams.DRIVER_ERRORS, CommandDenied):
                await asyncio.wait_for(self._leader.release(), timeout=STEP_END_S)

    async def _step(self) -> float:
        """One loop turn; returns how long to sleep (seconds). A leader sleeps at most a third
        of its lease, so it renews the lease in time."""
        try:
            if not await self._lead():
                return self._standby_wait_s()
            next_due_ms = await self.run_pass(self._token)
            retry_ms = await self._next_retry_ms()
        except Fenced as exc:
            self._log.warning("scheduler.fenced", error=str(exc))
            self._advancer.forget()
            if self._leader is not None:
                # Redis may be what failed: the lease then lapses by itself.
                with contextlib.suppress(*streams.DRIVER_ERRORS, CommandDenied):
                    await self._leader.release()
            return ERROR_PAUSE_S
        except (StoreUnavailable, *streams.DRIVER_ERRORS) as exc:
            self._log.warning("scheduler.dependency_down", error=streams.outage_text(exc))
            return ERROR_PAUSE_S
        except CommandDenied as exc:  # the lease or a retry's XADD: paused, then tried again
            self._denials += 1
            wait_s = max(ERROR_PAUSE_S, pause_s(self._denials))
            log_denied(self._log, exc, retry_in_s=wait_s)
            return wait_s
        self._denials = 0
        cap = min(self._config.max_sleep_s, self._renew_s)
        due = [t for t in (next_due_ms, retry_ms) if t is not None]
        if not due:
            return cap
        return min(cap, max(0.0, (min(due) - self._clock.now_ms()) / 1000))

    async def _next_retry_ms(self) -> int | None:
        """When the next retry is due (ms). After a pass that offered every retry due by its
        time and was refused some, the next due after that time counts (one due since then
        was not offered yet, and is due now), and the refused ones are offered again
        `REFUSED_RECHECK_S` after that pass, not in a loop with no sleep."""
        by = self._refused_by
        if by is None:
            return await self._store.next_retry_at()
        later = await self._store.next_retry_at(after_ms=by)
        recheck_ms = by + round(REFUSED_RECHECK_S * 1000)
        return recheck_ms if later is None else min(later, recheck_ms)

    def _standby_wait_s(self) -> float:
        """A standby tries again when the holder's lease lapses (plus a little, so the key
        is gone by then), or after a third of a lease, whichever is sooner: a killed leader
        is replaced within one lease, not one lease plus a polling interval."""
        left_ms = self._leader.lapses_in_ms if self._leader is not None else None
        if left_ms is None:
            return self._renew_s
        return min(self._renew_s, (left_ms + LAPSE_MARGIN_MS) / 1000)

    async def _lead(self) -> bool:
        """Hold or renew the lease; a new token means others may have moved cursors."""
        if self._leader is None:
            return True
        # Read before every hold, by a leader too: after Redis lost its token counter and a
        # newer leader's lease, a floor read long ago (a leader back from a pause, a standby)
        # would hand out the token that newer leader holds, and neither would be fenced.
        floor = await self._store.max_cursor_token() or 0
        token = await self._leader.hold(floor=floor)
        if token != self._token:
            if token is not None:
                # Before deciding anything: from here on an older leader still in a pass
                # records nothing (a failure here leaves the token to take over next step).
                taken = await self._store.claim_cursors(token)
                self._log.info("scheduler.cursors_claimed", token=token, count=taken)
            self._log.info("scheduler.leadership", token=token)
            self._advancer.forget()
            self._token = token
        return token is not None

    async def run_pass(self, token: int | None = None) -> int | None:
        """Re-emit due retries and decide every due tick; returns the next fire time (ms), or
        None when no active task has a schedule."""
        if await self._defs.refresh():
            self._log.info("scheduler.definitions_loaded", count=len(self._defs.current.specs))
            self._warn_unknown_checks()
        now_ms = self._clock.now_ms()
        await self._emit_due_retries(now_ms)
        loaded = self._defs.current
        running = [spec for task_id, spec in loaded.specs.items() if task_id not in loaded.paused]
        # On-demand tasks have no trigger.
        active = [(s, t) for s in running if (t := self._trigger(s)) is not None]
        # Without a schedule only a task once scheduled (it has a cursor) may have ticks
        # left waiting; the others cost nothing.
        idle = [s for s in running if on_demand(s) and s.id in loaded.cursored]
        gate = asyncio.Semaphore(TASKS_AT_ONCE)

        async def one(spec: TaskSpec, trigger: Trigger) -> int:
            async with gate:
                since_ms = loaded.schedule_from.get(spec.id)
                return await self._advancer.advance(spec, trigger, now_ms, token, since_ms=since_ms)

        async def closing(spec: TaskSpec) -> None:
            async with gate:
                await self._advancer.unscheduled(spec, now_ms, token)

        # Every task's advance ends before the pass does, even when one fails: a task still
        # deciding in the background would race the next pass over the same ticks.
        jobs = [one(s, t) for s, t in active] + [closing(s) for s in idle]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        return self._ended([s for s, _ in active] + idle, results)

    def _ended(
        self, specs: list[TaskSpec], results: list[int | BaseException | None]
    ) -> int | None:
        """The earliest next fire time of a pass whose tasks ended with `results`; a task's
        own failure is logged, one that concerns the whole pass is raised."""
        failed = [r for r in results if isinstance(r, BaseException)]
        # Being fenced matters most: it makes this scheduler step down; an outage pauses it.
        for kind in (Fenced, (StoreUnavailable, *streams.DRIVER_ERRORS)):
            if (first := next((f for f in failed if isinstance(f, kind)), None)) is not None:
                raise first
        for spec, result in zip(specs, results, strict=True):
            if isinstance(result, BaseException):
                self._task_failed(spec, result)
        nexts = [r for r in results if isinstance(r, int)]
        return min(nexts) if nexts else None

    def _warn_unknown_checks(self) -> None:
        """Preconditions no loaded module provides stay unavailable: their ticks wait until
        the window closes. `tasks apply` refuses them; definitions stored otherwise (or
        before a module was removed) are named here once per load."""
        for task_id, spec in sorted(self._defs.current.specs.items()):
            if missing := [n for n in spec.preconditions if n not in self._checks]:
                self._log.warning("task.precondition_unknown", task_id=task_id, names=missing)

    def _trigger(self, spec: TaskSpec) -> Trigger | None:
        try:
            return trigger_of(spec)
        except Exception as exc:  # one task's defect must not stop the others
            self._task_failed(spec, exc)
            return None

    def _task_failed(self, spec: TaskSpec, exc: BaseException) -> None:
        """One task could not be advanced (its definition cannot make an instance, say): it is
        logged and left where it was, tried again next pass; every other task goes on."""
        if not isinstance(exc, Exception):
            raise exc
        self._log.error(
            "task.advance_failed",
            task_id=spec.id,
            error_type=type(exc).__name__,
            error=str(exc)[:300],
        )

    async def _emit_due_retries(self, now_ms: int) -> None:
        """Publish RETRYING rows whose next attempt is due (RETRYING -> DISPATCHED), a page of
        `MAX_RETRIES_PER_PASS` per pass. Rows no entry can be made of, and rows that cannot
        be read (logged once, `UnreadableRows`), stay RETRYING and due: once a page holds
        some, the next passes read on past it (`_retries_after`) until a page is not full,
        so a full page of them cannot hide the retries due after it."""
        page = await self._store.due_retries(
            now_ms=now_ms, limit=MAX_RETRIES_PER_PASS, after=self._retries_after
        )
        due = self._unreadable.readable(page)
        refused = await self._outbox.publish_many(due, now_ms=now_ms) if due else {}
        passed = bool(refused) or len(due) < len(page)
        self._refused_in_cycle = self._refused_in_cycle or passed
        if len(page) == MAX_RETRIES_PER_PASS and self._refused_in_cycle:
            last = page[-1]
            self._retries_after, self._refused_by = (last.next_attempt_at_ms or 0, last.id), None
        else:  # every retry due by now has been offered since the cycle began
            self._retries_after = None
            self._refused_by = now_ms if self._refused_in_cycle else None
            self._refused_in_cycle = False
        if not due:
            return
        runs = [f"{r.id}@{r.attempt}" for r in due if r.id not in refused]
        self._log.info("retries.emitted", count=len(runs), runs=runs)
