"""The executor process: read only as many entries as there are free slots, claim them in one
batch, run each in its own task, group-commit the ends, and keep leases held meanwhile.

Entries read in a batch whose intake failed (the store or Redis did not answer) stay this
process's to admit: after a pause the same batch is admitted again before anything new is
read (`reader`), so a store outage delays them by the outage, not by the sweeper's unclaimed
timeout.

On stop: reading stops, in-flight runs get `grace_s` (counted from the stop, however long the
step under way takes to end) to finish, the rest are cancelled and
released (RETRYING, due now, so another executor picks them up at once), pending commits are
written, the liveness key is removed. After the grace, a commit or release the store cannot
take (it is unavailable) gets one more try, then is given up: the sweeper recovers those runs
and the process exits. Releases and ends given up are noted in Redis first, so that the
sweeper releases those runs instead of timing them out (`handover`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import httpx
from redis.exceptions import ResponseError

from taskstream.core import notify, streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.denials import log_denied, pause_s
from taskstream.core.errors import CommandDenied, StoreError, StoreUnavailable, WrongType
from taskstream.core.futures import STEP_END_S, unless_stopped
from taskstream.core.logging import get_logger
from taskstream.executor.committer import Committer
from taskstream.executor.handover import Handover, drain, grace_left_s, last_commits
from taskstream.executor.heartbeat import OVERRUN_S, Heartbeat
from taskstream.executor.intake import Intake, Run
from taskstream.executor.liveness import LivenessThread
from taskstream.executor.outcome import failed, timed_out
from taskstream.executor.reader import Reader
from taskstream.executor.retry import deadline_passed
from taskstream.executor.runner import AGENT_FAILURES, RunEnv, execute
from taskstream.executor.setup import ExecutorConfig, ExecutorDeps, consumer_name

__all__ = ["Executor", "ExecutorConfig", "ExecutorDeps", "consumer_name", "execute"]

ERROR_PAUSE_S = 1.0
DEFINITIONS_CHECK_S = 1.0
"""How long a stop waits for the runs it cancelled after the grace (their releases included)
before it leaves those still going: agents that ignore cancellation."""


class Executor:
    """One executor process in the `executors` consumer group."""

    def __init__(self, deps: ExecutorDeps, config: ExecutorConfig) -> None:
        self._deps, self._config = deps, config
        self._defs = DefinitionCache(deps.store, min_interval_s=DEFINITIONS_CHECK_S)
        self._heartbeat = Heartbeat(
            deps.store,
            deps.redis,
            deps.keys,
            config.consumer,
            deps.clock,
            liveness_ttl_s=config.liveness_ttl_s,
            on_overrun=self._overrun,
        )
        self._intake = Intake(
            deps.store,
            deps.redis,
            deps.keys,
            deps.registry,
            self._defs,
            config.consumer,
            held=self._heartbeat.ran,
        )
        self._committer = Committer(
            deps.store, deps.redis, deps.keys, deps.clock, deps.rng, self._intake.dead
        )
        self._handover = Handover(
            self._committer, deps.redis, deps.keys, deps.clock, config.consumer
        )
        self._running: set[asyncio.Task[None]] = set()
        self._stop_at: float | None = None
        """When the stop came (the event loop's clock, s); None before."""
        self._denials = 0
        """Steps in a row that Redis denied (see `_denied`)."""
        self._log = get_logger(role="executor", consumer=config.consumer)
        self._reader = Reader(
            deps.redis,
            deps.keys,
            config.consumer,
            config.block_ms,
            self._heartbeat.entries,
            self._log,
            round(config.liveness_ttl_s * 1000),
            deps.clock.now_ms,
        )
        self._env = RunEnv(
            deps.store,
            deps.clock,
            config.max_payload_bytes,
            on_marker=self._marker_set,
            gate=deps.gate,
            log=self._log,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Read and run until `stop` is set, then drain (see the module docstring)."""
        # Redis or the store down (the store not migrated yet) at start is waited for like an
        # outage later: `_step` makes a missing group, refreshes again and logs the outage.
        with contextlib.suppress(*streams.DRIVER_ERRORS):
            await self._make_groups()
        with contextlib.suppress(StoreUnavailable):
            await unless_stopped(self._defs.refresh(), stop)
        background = asyncio.Event()
        helpers = [
            asyncio.create_task(self._heartbeat.run(background)),
            asyncio.create_task(self._committer.run(background)),
        ]
        # One connection pool for every run's upstream calls (`ctx.http`).
        http = httpx.AsyncClient(follow_redirects=False)
        self._env = replace(self._env, http=http)
        # An agent holding the event loop must not make the process look gone (`liveness`).
        alive = LivenessThread(
            self._deps.redis, self._deps.keys, self._config.consumer, self._heartbeat.ttl_ms
        )
        alive.start()
        self._log.info("executor.started", concurrency=self._config.concurrency)
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(self._stopped)
        try:
            while not stop.is_set():
                await unless_stopped(self._step(stop), stopping)
        finally:
            stopping.cancel()
            await self._hand_back()
            await self._drain()
            self._committer.last_tries()
            background.set()
            beat, commits = helpers
            await last_commits(self._committer, commits, self._log)
            await self._handover.note_unwritten()
            # Every end is written or given up: no lease needs extending any more, and a beat
            # waiting for a row lock (held by a stuck transaction) must not hold the exit up.
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            await http.aclose()
            await alive.stop()
            # A Redis that stopped answering must not hold the exit up: the key then expires.
            with contextlib.suppress(TimeoutError, *streams.DRIVER_ERRORS, CommandDenied):
                await asyncio.wait_for(self._heartbeat.clear(), timeout=STEP_END_S)
            self._log.info("executor.stopped")

    async def _step(self, stop: asyncio.Event) -> None:
        free = self._config.concurrency - len(self._running)
        if free <= 0:
            await _until_one_ends(self._running, stop)
            return
        try:
            await self._defs.refresh()
            runs = await self._intake.admit(await self._reader.next(free))
            self._reader.admitted()
            self._denials = 0
        except CommandDenied as exc:
            await self._denied(exc)
            return
        except (StoreUnavailable, *streams.DRIVER_ERRORS) as exc:
            # Before ResponseError: a refusal such as READONLY is one, and is an outage here.
            await self._outage(exc)
            return
        except ResponseError as exc:
            if streams.role_changed(exc):
                await self._outage(exc)
                return
            if not streams.group_missing(exc):
                raise
            self._log.warning("executor.group_missing")
            # The batch goes, but not what this consumer was delivered from the streams whose
            # group is there: a read walking the streams took entries before it met the
            # missing group, a touch of the batch failed for all of its streams. They are
            # offered from our pending list next (a group made anew has none).
            self._reader.admitted()
            self._reader.redis_failed()
            try:
                await self._make_groups()
            except streams.DRIVER_ERRORS as again:
                await self._outage(again)
            return
        for run in runs:
            task = asyncio.create_task(self._execute(run))
            self._running.add(task)
            self._heartbeat.track(run, task)
            task.add_done_callback(self._running.discard)

    async def _make_groups(self) -> None:
        """Make the missing groups. A work-stream key of another type is left out of the
        reads for a while (`Reader.hold`): the other streams go on."""
        try:
            await streams.ensure_groups(self._deps.redis, self._deps.keys)
        except WrongType as exc:
            self._reader.hold(exc)

    async def _outage(self, exc: Exception) -> None:
        """The store or Redis did not answer: log it and pause before the next step."""
        self._log.warning(
            "executor.dependency_down",
            error=streams.outage_text(exc),
            unadmitted=len(self._reader.unadmitted),
        )
        if not isinstance(exc, StoreUnavailable):
            self._reader.redis_failed()
        await asyncio.sleep(ERROR_PAUSE_S)

    async def _denied(self, exc: CommandDenied) -> None:
        """Redis denied reading or taking entries: log it and pause, longer at each denial
        in a row (`denials.pause_s`). Runs, heartbeats and commits go on meanwhile; a batch
        read before the denial stays this process's to admit."""
        self._denials += 1
        wait_s = pause_s(self._denials)
        log_denied(self._log, exc, retry_in_s=wait_s, unadmitted=len(self._reader.unadmitted))
        await asyncio.sleep(wait_s)

    async def _execute(self, run: Run) -> None:
        queued = False
        try:
            try:
                end = await execute(run, self._env)
            except asyncio.CancelledError:  # a stop, a fence or an overrun: handled below
                raise
            except AGENT_FAILURES as exc:  # a defect around the agent: retriable, never lost
                self._log.error(
                    "instance.run_crashed",
                    instance_id=run.row.id,
                    attempt=run.token,
                    error_type=type(exc).__name__,
                )
                end = failed(exc)
            if run.overran:  # its end is queued already: what the agent did is dropped
                return
            # The slot frees as soon as the end is queued, so the next read and claim overlap
            # this run's commit. The run stays tracked, its lease kept, until the commit is
            # done: a commit the store makes wait must not lose the run to a lease timeout.
            done = self._handover.end(run, end)
            done.add_done_callback(lambda _: self._heartbeat.untrack(run))
            queued = True
        except asyncio.CancelledError:
            if run.fenced or run.overran or not self._handover.stopping:
                raise
            with contextlib.suppress(StoreError):  # noted at exit (`Handover.note_unwritten`)
                await asyncio.shield(self._handover.release(run))
        finally:
            if not queued:
                self._heartbeat.untrack(run)

    def _overrun(self, run: Run) -> None:
        """A run whose agent ignored its cancellation `OVERRUN_S` past its time limit: its
        attempt ends now as the timeout it is (retried or failed under the task's `retry_on`,
        its entry acked), while the agent keeps its slot until it ends."""
        why = f"the attempt ran {OVERRUN_S:g} s past its time limit, ignoring its cancellation"
        past = deadline_passed(run.row.deadline_ms, self._deps.clock.now_ms())
        done = self._handover.end(run, timed_out(why, at_deadline=past))
        done.add_done_callback(lambda _: self._heartbeat.untrack(run))

    async def _marker_set(self) -> None:
        await notify.hint(self._deps.redis, self._deps.keys, "marker")

    async def _hand_back(self) -> None:
        """Release the claims of an admission the stop cancelled before they became runs, and
        keep for the notes those whose claim may have landed unseen."""
        runs, unsure = await self._intake.unstarted(STEP_END_S)
        for run in runs:
            self._handover.release(run)
        self._handover.unsure(unsure)

    def _stopped(self, stopping: asyncio.Future[Any]) -> None:
        """The stop came: the grace starts now (`_drain`)."""
        if not stopping.cancelled():
            self._stop_at = asyncio.get_running_loop().time()

    async def _drain(self) -> None:
        self._handover.stop()
        now = asyncio.get_running_loop().time()
        grace_s = grace_left_s(self._config.grace_s, self._stop_at, now)
        await drain(self._running, grace_s, self._committer, self._log)


async def _until_one_ends(running: set[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait until a run ends or `stop` is set: with every slot busy, a stop must still start
    the grace at once, not when some run happens to end."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({*running, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
