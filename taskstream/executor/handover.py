"""Releases and ends at stop, and those the store could not take handed over through Redis.

A stopping executor releases the runs it cut short: RUNNING -> RETRYING, due now, not counted
as an attempt (`release_plan`), written by its committer like any end. In a store outage that
write fails and the run stays RUNNING under the stopped executor's lease; the sweeper, finding
the executor's liveness key gone, would time it out as `owner_lost`, spending an attempt. So
before removing its liveness key the executor notes each release the store did not take in
Redis (`Keys.released`, kept `RELEASED_TTL_S`), which may well be up while the store is down.
A sweeper that finds such a note for a lost owner's run (`sweep.ReleaseNote`: the row's
attempt, its lease owner) makes the release itself once the store answers (`make_release`),
the same move and history row, conditioned like a timeout on the attempt (the fencing token)
and on the lease as it read it. With Redis down too nothing is noted: the run is timed out as
a lost owner's, as before. A claim whose reply the outage lost is noted the same way
(`Handover.unsure`): it may hold its row RUNNING under the stopped executor with no run.

A run that ended (its agent succeeded, failed, timed out) whose end the outage keeps from the
store by the stop is in the same place: RUNNING, its end and the side-effect rows committed
with it written nowhere, so it must run again. It is noted and released the same way, the note
naming the end that was lost (`protocol.release_note`). The history says so in the release's
`note` (`LOST_END`), under the reason `released` itself: the move is a release's in every way
(due now, not an attempt), so what counts attempts (`retry.attempts_used`, `every_run_lost`)
needs no new reason. An end that did land, its reply lost with the link, may be noted too: the
sweeper reads a note only for a row RUNNING at the note's attempt, which that row no longer is.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.denials import commands
from taskstream.core.errors import CommandDenied, StoreError, StoreUnavailable
from taskstream.core.futures import CANCEL_WAIT_S, STEP_END_S
from taskstream.core.logging import get_logger
from taskstream.core.protocol import RELEASED_TTL_S, Keys, read_release_note, release_note
from taskstream.core.reasons import RELEASED
from taskstream.core.states import Status
from taskstream.core.store.port import FinishRequest, InstanceRow, Store
from taskstream.executor.committer import Committer
from taskstream.executor.intake import Run
from taskstream.executor.outcome import Plan, RunEnd
from taskstream.executor.sweep import ReleaseNote

PRUNE_AT = 4096
"""Queued ends kept before those already done are forgotten (`Handover._prune`)."""
STUCK_S = 10.0
"""How long a stop waits, past the grace, for runs whose agents ignore their cancellation (s)."""
LOST_END = "its end ({end}) was not written: the store was down when its executor stopped"
"""The history note of a release made for a run whose end (`{end}`: its reason) was lost."""


def release_plan(run: Run, now_ms: int) -> Plan:
    """Hand an unfinished run back: RETRYING, due at `now_ms`, at its token."""
    return Plan(
        FinishRequest(
            run.row.id,
            run.token,
            Status.RETRYING,
            RELEASED,
            next_attempt_at_ms=now_ms,
            owner=run.row.lease_owner,
        )
    )


@dataclass(frozen=True, slots=True)
class Handed:
    """A run to hand back through a note: its instance, its token, and when it ended, the
    reason of the end the store did not take (None for a run cut short)."""

    instance_id: str
    token: int
    lost_end: str | None = None

    def named(self) -> str:
        """`id@token`, and `:reason` of a lost end, as in the log lines."""
        run = f"{self.instance_id}@{self.token}"
        return run if self.lost_end is None else f"{run}:{self.lost_end}"


class Handover:
    """The ends and releases of one executor, and at its stop the note of those the store did
    not take."""

    def __init__(
        self, committer: Committer, redis: streams.Redis, keys: Keys, clock: Clock, consumer: str
    ) -> None:
        self._committer, self._redis, self._keys, self._clock = committer, redis, keys, clock
        self._consumer = consumer
        self._releases: list[tuple[Handed, asyncio.Future[bool]]] = []
        self._unsure: list[Handed] = []
        """Claims that may have landed unseen (`unsure`): noted, never written."""
        self._ends: dict[asyncio.Future[bool], tuple[Run, RunEnd]] = {}
        """Ends queued (those done before the stop pruned now and then, and at the stop)."""
        self._prune_at = PRUNE_AT
        self._stopping = False
        self._log = get_logger(role="executor", consumer=consumer)

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called: runs cut short from now on are released."""
        return self._stopping

    def stop(self) -> None:
        """The stop has begun: an end the store fails to take from now on is kept for the
        note (before it, a failed end is a value the store refused, or a step after the
        commit, and its run is left to the sweeper as ever)."""
        if not self._stopping:
            self._stopping = True
            self._prune()

    def end(self, run: Run, run_end: RunEnd) -> asyncio.Future[bool]:
        """Queue `run`'s end for commit; the future is `Committer.enqueue`'s."""
        done = self._committer.enqueue(run, run_end)
        self._ends[done] = (run, run_end)
        if len(self._ends) >= self._prune_at and not self._stopping:
            self._prune()
        return done

    def _prune(self) -> None:
        """Forget the ends already done. Amortised: at most a few hundred are in flight (an
        executor's slots), so a prune every `PRUNE_AT` ends keeps this O(1) per end, where
        a callback on every end's future cost an event-loop turn each."""
        self._ends = {done: end for done, end in self._ends.items() if not done.done()}
        self._prune_at = max(PRUNE_AT, 2 * len(self._ends))

    def release(self, run: Run) -> asyncio.Future[bool]:
        """Queue `run`'s release for commit; the future is `Committer.put_plan`'s."""
        self._log.info("instance.released", instance_id=run.row.id, attempt=run.token)
        done = self._committer.put_plan(run, release_plan(run, self._clock.now_ms()))
        self._releases.append((Handed(run.row.id, run.token), done))
        return done

    def unsure(self, claims: list[tuple[str, int]]) -> None:
        """Note at the stop these claims, (instance id, token), whose reply the store lost in
        an outage: each may hold its row RUNNING under this executor with no run. A note of
        one that did not land is never taken (the row is not RUNNING at that token under
        this owner)."""
        self._unsure += [Handed(instance_id, token) for instance_id, token in claims]

    async def note_unwritten(self) -> None:
        """Note in Redis every queued release the store did not take (it failed on the store,
        or its commit was given up), every claim whose reply it lost (`unsure`), and every
        end the outage kept from it (still queued or given up, or failed with the store
        unavailable): call it once the last commits are over and before the liveness key
        goes, so that a sweeper that finds the key gone finds the notes too. A Redis that
        fails (or is `STEP_END_S` without an answer) leaves them un-noted. An end the store
        refused (not an outage) is not handed back: its run is timed out, its attempt spent,
        as it is when no stop comes."""
        handed = [h for h, done in self._releases if _unwritten(done, StoreError)]
        handed += self._unsure
        handed += [
            Handed(run.row.id, run.token, end.reason)
            for done, (run, end) in self._ends.items()
            if _unwritten(done, StoreUnavailable)
        ]
        if not handed:
            return
        runs = [h.named() for h in handed]
        try:
            await asyncio.wait_for(
                note(self._redis, self._keys, handed, self._consumer), timeout=STEP_END_S
            )
        except (TimeoutError, CommandDenied, *streams.DRIVER_ERRORS) as exc:
            self._log.error("executor.releases_lost", runs=runs, error=str(exc)[:300])
            return
        self._log.warning("executor.releases_noted", runs=runs)


def _unwritten(done: asyncio.Future[bool], failure: type[StoreError]) -> bool:
    """The commit did not land: still queued or cut off, or it failed with `failure` on the
    store (a failure after its commit, such as its ack, is not one)."""
    if not done.done() or done.cancelled():
        return True
    return isinstance(done.exception(), failure)


@commands("SET")
async def note(redis: streams.Redis, keys: Keys, handed: list[Handed], owner: str) -> None:
    """Note the releases of `handed` by lease owner `owner`."""
    async with redis.pipeline(transaction=False) as pipe:
        for h in handed:
            value = release_note(owner, h.lost_end)
            pipe.set(keys.released(h.instance_id, h.token), value, ex=RELEASED_TTL_S)
        await pipe.execute()


@commands("GET")
async def noted(redis: streams.Redis, keys: Keys, row: InstanceRow) -> ReleaseNote | None:
    """The release noted for `row`'s attempt, if any. Bytes that are not UTF-8 (written by some
    other program) are read as U+FFFD: never a consumer name, so no release of this run."""
    value: bytes | str | None = await redis.get(keys.released(row.id, row.attempt))
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    owner, lost_end = read_release_note(text)
    return ReleaseNote(row.attempt, owner, lost_end)


@commands("DEL")
async def make_release(
    store: Store,
    redis: streams.Redis,
    keys: Keys,
    row: InstanceRow,
    found: ReleaseNote,
    *,
    now_ms: int,
) -> bool:
    """Make the release a stopped owner noted (`found`) for `row` (as read, RUNNING): the move
    its own release would have made, only while the row is at that attempt with its lease as
    read (a heartbeat since proves an owner alive), with `LOST_END` as its history note when
    the note names a lost end; the note goes once it is made. False when the CAS lost: the
    row moved on, and nothing changed."""
    lost = found.lost_end
    moved = await store.transition(
        row.id,
        Status.RUNNING,
        Status.RETRYING,
        reason=RELEASED,
        attempt=row.attempt,
        owner=row.lease_owner,
        next_attempt_at_ms=now_ms,
        lease_until=row.lease_expires_at_ms,
        note=None if lost is None else LOST_END.format(end=lost),
    )
    get_logger(role="sweeper").info(
        "instance.released",
        instance_id=row.id,
        attempt=row.attempt,
        ok=moved.ok,
        noted=True,
        lost_end=lost,
    )
    if moved.ok:
        await redis.delete(keys.released(row.id, row.attempt))
    return moved.ok


def grace_left_s(grace_s: float, stop_at: float | None, now: float) -> float:
    """What is left at `now` of a grace of `grace_s` that began at `stop_at` (s, monotonic;
    None: it begins now). The grace counts from the stop: what a stop waits for before its
    drain (the step under way, `STEP_END_S` and `CANCEL_WAIT_S`; a claim landing,
    `STEP_END_S`) takes from it, so that a stopped process ends when its supervisor (`up`,
    a container runtime) expects."""
    if stop_at is None:
        return grace_s
    return max(0.0, grace_s - max(0.0, now - stop_at))


async def drain(
    running: set[asyncio.Task[None]],
    grace_s: float,
    committer: Committer,
    log: FilteringBoundLogger,
) -> None:
    """Let the `running` runs finish within `grace_s`, then cancel the rest (their releases
    are queued as they end) and give every queued commit one more try; wait `STUCK_S` for
    agents that ignore their cancellation, whose runs are then left to the sweeper."""
    if not running:
        return
    log.info("executor.draining", in_flight=len(running))
    _, pending = await asyncio.wait(set(running), timeout=grace_s)
    for task in pending:
        task.cancel()
    # The grace is over: the releases of the cancelled runs, and any commit still waiting
    # for an unavailable store, get one more try each instead of holding the exit up.
    committer.last_tries()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=STUCK_S)
        if stuck:
            log.error("executor.runs_stuck", runs=len(stuck))


async def last_commits(
    committer: Committer, commits: asyncio.Task[None], log: FilteringBoundLogger
) -> None:
    """Let `committer` (its task `commits`) write what is queued, for as long as the store
    keeps answering its commits (a slow store still commits them all). A commit the store
    holds up past `STEP_END_S` with no answer (a row lock, a server that stopped answering)
    is cancelled like a stopped step: its runs stay RUNNING, handed over by the notes
    (`Handover.note_unwritten`) or recovered by the sweeper once the liveness key is gone."""
    seen = -1
    while not commits.done() and committer.commits_answered != seen:
        seen = committer.commits_answered
        await asyncio.wait({commits}, timeout=STEP_END_S)
    if not commits.done():
        log.warning("executor.commits_abandoned", queued=committer.queued)
        commits.cancel()
    await asyncio.wait({commits}, timeout=CANCEL_WAIT_S)
    if commits.done() and not commits.cancelled():
        commits.exception()
