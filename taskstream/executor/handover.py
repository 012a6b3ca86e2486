"""Releases at stop, and those the store could not take handed over through Redis.

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
a lost owner's, as before.
"""

from __future__ import annotations

import asyncio

from taskstream.core import streams
from taskstream.core.clock import Clock
from taskstream.core.errors import StoreError
from taskstream.core.futures import STEP_END_S
from taskstream.core.logging import get_logger
from taskstream.core.protocol import RELEASED_TTL_S, Keys
from taskstream.core.reasons import RELEASED
from taskstream.core.states import Status
from taskstream.core.store.port import FinishRequest, InstanceRow, Store
from taskstream.executor.committer import Committer
from taskstream.executor.intake import Run
from taskstream.executor.outcome import Plan
from taskstream.executor.sweep import ReleaseNote


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


class Releases:
    """The releases of one stopping executor, and the note of those the store did not take."""

    def __init__(
        self, committer: Committer, redis: streams.Redis, keys: Keys, clock: Clock, consumer: str
    ) -> None:
        self._committer, self._redis, self._keys, self._clock = committer, redis, keys, clock
        self._consumer = consumer
        self._queued: list[tuple[Run, asyncio.Future[bool]]] = []
        self._log = get_logger(role="executor", consumer=consumer)

    def release(self, run: Run) -> asyncio.Future[bool]:
        """Queue `run`'s release for commit; the future is `Committer.put_plan`'s."""
        self._log.info("instance.released", instance_id=run.row.id, attempt=run.token)
        done = self._committer.put_plan(run, release_plan(run, self._clock.now_ms()))
        self._queued.append((run, done))
        return done

    async def note_unwritten(self) -> None:
        """Note in Redis every queued release the store did not take (it failed on the store,
        or its commit was given up): call it once the last commits are over and before the
        liveness key goes, so that a sweeper that finds the key gone finds the notes too. A
        Redis that fails (or is `STEP_END_S` without an answer) leaves them un-noted."""
        claims = [(run.row.id, run.token) for run, done in self._queued if _unwritten(done)]
        if not claims:
            return
        runs = [f"{instance_id}@{token}" for instance_id, token in claims]
        try:
            await asyncio.wait_for(
                note(self._redis, self._keys, claims, self._consumer), timeout=STEP_END_S
            )
        except (TimeoutError, *streams.DRIVER_ERRORS) as exc:
            self._log.error("executor.releases_lost", runs=runs, error=str(exc)[:300])
            return
        self._log.warning("executor.releases_noted", runs=runs)


def _unwritten(done: asyncio.Future[bool]) -> bool:
    """The release did not land: still queued or cut off, or it failed on the store (a
    failure after its commit, such as its ack, is not one)."""
    if not done.done() or done.cancelled():
        return True
    return isinstance(done.exception(), StoreError)


async def note(redis: streams.Redis, keys: Keys, claims: list[tuple[str, int]], owner: str) -> None:
    """Note the releases of `claims` ((instance id, token)) by lease owner `owner`."""
    async with redis.pipeline(transaction=False) as pipe:
        for instance_id, token in claims:
            pipe.set(keys.released(instance_id, token), owner, ex=RELEASED_TTL_S)
        await pipe.execute()


async def noted(redis: streams.Redis, keys: Keys, row: InstanceRow) -> ReleaseNote | None:
    """The release noted for `row`'s attempt, if any."""
    owner: bytes | str | None = await redis.get(keys.released(row.id, row.attempt))
    if owner is None:
        return None
    return ReleaseNote(row.attempt, owner.decode() if isinstance(owner, bytes) else owner)


async def make_release(
    store: Store, redis: streams.Redis, keys: Keys, row: InstanceRow, *, now_ms: int
) -> bool:
    """Make the release a stopped owner noted for `row` (as read, RUNNING): the move its own
    release would have made, only while the row is at that attempt with its lease as read (a
    heartbeat since proves an owner alive); the note goes once it is made. False when the
    CAS lost: the row moved on, and nothing changed."""
    moved = await store.transition(
        row.id,
        Status.RUNNING,
        Status.RETRYING,
        reason=RELEASED,
        attempt=row.attempt,
        owner=row.lease_owner,
        next_attempt_at_ms=now_ms,
        lease_until=row.lease_expires_at_ms,
    )
    get_logger(role="sweeper").info(
        "instance.released", instance_id=row.id, attempt=row.attempt, ok=moved.ok, noted=True
    )
    if moved.ok:
        await redis.delete(keys.released(row.id, row.attempt))
    return moved.ok
