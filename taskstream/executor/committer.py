"""Group commit: finished runs are committed in batches, then acknowledged.

While one batch is being written, new finishes queue up and go in the next; at low load a
batch is a single run, so batching adds no latency. The commit is conditioned on each run's
fencing token; a fenced run is not acknowledged. Commit and ack run in their own task, so a
cancelled run handler never interrupts them halfway.

A batch the store could not write (unavailable, connection lost) is written again after a
pause until it is, or until one more try after stop: a run that finished is never dropped
and left to time out and run again because the database blinked. When such a retry loses its
CAS to the run's own earlier try (applied, but its answer lost with the link), the history
shows the run's own move and the run counts as committed: acked now, not left to the sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from random import Random

from taskstream.core import notify, streams
from taskstream.core.clock import Clock
from taskstream.core.denials import log_denied
from taskstream.core.errors import CommandDenied, StoreRefused, StoreUnavailable
from taskstream.core.futures import mark_retrieved
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys
from taskstream.core.reasons import after
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, Store
from taskstream.executor.confirm import landed
from taskstream.executor.intake import Run
from taskstream.executor.outcome import Attempt, Plan, RunEnd, plan, refused_plan
from taskstream.executor.retry import Failure

MAX_BATCH = 200
RETRY_PAUSE_S = 1.0
"""Pause before writing again a batch the store could not write (seconds)."""
DeadLetter = Callable[[streams.Delivery, str, str], Awaitable[None]]


@dataclass(slots=True)
class _Item:
    run: Run
    plan: Plan
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """Commits finished runs for one executor process."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        clock: Clock,
        rng: Random,
        dead: DeadLetter,
    ) -> None:
        self._store, self._redis, self._clock, self._rng = store, redis, clock, rng
        self._keys = keys
        self._dead = dead
        self._waiting: list[_Item] = []
        """Ends queued for the next batch, oldest first."""
        self._queued = asyncio.Event()
        """Set when `_waiting` may be non-empty."""
        self._final = asyncio.Event()
        """Set by `last_tries`: the process is stopping, so an unavailable store is not
        waited for."""
        self._commits_answered = 0
        """Commits (a batch, or a run of a refused batch) the store answered: progress, which
        a stop waits for while it moves."""
        self._log = get_logger(role="executor")

    def enqueue(self, run: Run, end: RunEnd) -> asyncio.Future[bool]:
        """Queue a run's end for commit without waiting: the future resolves True when it is
        committed and acked, False when fenced. The caller may free the run's slot at once;
        the commit stays conditioned on the token and the ack still follows it."""
        row = run.row
        attempt = Attempt(
            row.id, run.token, run.attempts_used, run.policy, row.deadline_ms, row.lease_owner
        )
        p = plan(attempt, end, now_ms=self._clock.now_ms(), rng=self._rng)
        item = _Item(run, p.with_effects(run.side_effects))
        # Failures are logged by the loop (`commit.failed`); nobody else must report them.
        item.done.add_done_callback(mark_retrieved)
        self._put(item)
        return item.done

    def put_plan(self, run: Run, p: Plan) -> asyncio.Future[bool]:
        """Queue an explicit plan (e.g. a lease release at shutdown) without waiting; the
        future is `enqueue`'s."""
        item = _Item(run, p.with_effects(run.side_effects))
        item.done.add_done_callback(mark_retrieved)
        self._put(item)
        return item.done

    @property
    def commits_answered(self) -> int:
        """Commits the store has answered so far (landed or fenced, not failed): progress."""
        return self._commits_answered

    @property
    def queued(self) -> int:
        """Ends waiting for a batch (not counting the batch being written)."""
        return len(self._waiting)

    def last_tries(self) -> None:
        """From now on a commit the store cannot take (it is unavailable) is tried once more,
        then given up: the runs stay RUNNING for the sweeper to recover. Commits keep being
        written until `run`'s stop, so a release queued after this still gets its try."""
        self._final.set()

    def _put(self, item: _Item) -> None:
        self._waiting.append(item)
        self._queued.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Commit batches until `stop` is set and the queue is empty."""
        while not (stop.is_set() and not self._waiting):
            if not self._waiting:
                self._queued.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._queued.wait(), timeout=0.2)
                continue
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                await self._commit(batch, stop)
            except Exception as exc:  # the loop must outlive any one batch
                self._failed(batch, exc)

    async def _commit(self, batch: list[_Item], stop: asyncio.Event) -> None:
        try:
            results, retried = await self._finish(batch, stop)
        except Exception as exc:
            if len(batch) > 1 and not isinstance(exc, StoreUnavailable):
                # A finish the store refuses (a value it will not take) must not fail the
                # runs batched with it: each is written on its own.
                self._log.warning("commit.batch_refused", error=str(exc)[:300], runs=len(batch))
                for item in batch:
                    await self._commit_alone(item, stop)
                return
            self._log.warning(
                "commit.refused", error=str(exc)[:300], runs=[_named(i) for i in batch]
            )
            instead = _instead(batch, exc)
            if instead is not None:
                await self._commit([instead], stop)
                return
            for item in batch:
                item.done.set_exception(exc)
            return
        committed: list[_Item] = []
        for item in batch:
            result = results.get(item.run.row.id, CasResult(ok=False))
            if result.ok or (
                retried and await landed(self._store, item.plan.finish, result, self._log)
            ):
                committed.append(item)
            else:
                self._log.warning(
                    "instance.fenced",
                    instance_id=item.run.row.id,
                    attempt=item.run.token,
                    found=result.found,
                )
                item.done.set_result(False)
        await self._settle(committed)

    async def _commit_alone(self, item: _Item, stop: asyncio.Event) -> None:
        """Commit one run of a refused batch. A failure after its commit (its ack, say) ends
        this run's future only: the runs after it in the batch still get their commit."""
        try:
            await self._commit([item], stop)
        except Exception as exc:
            self._failed([item], exc)

    def _failed(self, items: list[_Item], exc: Exception) -> None:
        """End with `exc` the futures of `items` not ended yet (`commit.failed`)."""
        self._log.warning("commit.failed", error=str(exc)[:300], runs=[_named(i) for i in items])
        for item in items:
            if not item.done.done():
                item.done.set_exception(exc)

    async def _finish(
        self, batch: list[_Item], stop: asyncio.Event
    ) -> tuple[dict[str, CasResult], bool]:
        """The batch's final CAS, written again while the store is unavailable, and whether it
        was. After `stop` or `last_tries` one more try is made, then the error is raised (the
        sweeper recovers those runs)."""
        requests = [i.plan.finish for i in batch]
        retried = False
        while True:
            stopping = stop.is_set() or self._final.is_set()
            try:
                results = await self._store.finish_many(requests)
            except StoreUnavailable as exc:
                if stopping:
                    raise
                self._log.warning("commit.retrying", error=str(exc)[:300], runs=len(batch))
            else:
                self._commits_answered += 1
                return results, retried
            retried = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._final.wait(), timeout=RETRY_PAUSE_S)

    async def _settle(self, committed: list[_Item]) -> None:
        """Follow the batch's commit: the second move of timed-out runs, dead letters, then one
        ack for the rest. A run whose follow-up failed is not acked (the sweeper recovers its
        entry, the reconciler its row) and does not hold back the acks of the others."""
        acks: list[streams.Delivery] = []
        settled: list[_Item] = []
        for item in committed:
            try:
                acks.extend(await self._follow_up(item))
            except Exception as exc:  # one run's follow-up must not keep the others pending
                self._log.warning(
                    "commit.follow_up_failed",
                    instance_id=item.plan.finish.instance_id,
                    attempt=item.plan.finish.token,
                    error=str(exc)[:300],
                )
                item.done.set_exception(exc)
                continue
            settled.append(item)
        if settled:
            # Successes are logged once per batch (see `Intake._claim`); other ends above.
            self._log.info(
                "instances.committed",
                count=len(settled),
                runs=[_named(item) for item in settled],
            )
        try:
            await streams.ack_many(self._redis, acks)
        except CommandDenied as exc:
            # The runs are committed: their entries stay pending, and the sweeper acks them
            # from the store's answer (pausing while Redis denies it too).
            log_denied(self._log, exc, entries=[d.entry_id for d in acks], left_for="sweeper")
        if any(item.plan.retries for item in settled):
            await notify.hint(self._redis, self._keys, "retry")
        for item in settled:
            item.done.set_result(True)

    async def _follow_up(self, item: _Item) -> list[streams.Delivery]:
        """A committed run's moves after its commit; the deliveries to ack for it."""
        finish = item.plan.finish
        if item.plan.after_timeout is not None:
            await self._leave_timeout(item)
        acks = list(item.run.duplicates)
        if finish.fail_class is FailClass.POISON:
            await self._dead(item.run.delivery, finish.reason, finish.error or "")
        else:
            acks.append(item.run.delivery)
        if finish.dst is not Status.SUCCESS:
            self._log.info(
                "instance.committed",
                instance_id=finish.instance_id,
                attempt=finish.token,
                status=finish.dst,
                reason=finish.reason,
                fail_class=finish.fail_class,
            )
        return acks

    async def _leave_timeout(self, item: _Item) -> None:
        decision = item.plan.after_timeout
        if decision is None:
            return
        await self._store.transition(
            item.run.row.id,
            Status.TIMEOUT,
            decision.status,
            reason=after(Failure.TIMEOUT),
            attempt=item.run.token,
            fail_class=decision.fail_class,
            next_attempt_at_ms=decision.next_attempt_at_ms,
        )


def _named(item: _Item) -> str:
    """`id@attempt:STATUS`, as in the batch log lines."""
    finish = item.plan.finish
    return f"{finish.instance_id}@{finish.token}:{finish.dst.value}"


def _instead(batch: list[_Item], exc: Exception) -> _Item | None:
    """The one run of `batch`, whose end the store refused, with `refused_plan`'s end. Only a
    `StoreRefused` (a value the store will not take) ends a run: any other error may pass."""
    if len(batch) != 1 or not isinstance(exc, StoreRefused):
        return None
    [item] = batch
    p = refused_plan(item.plan, str(exc)[:500])
    return None if p is None else _Item(item.run, p, item.done)
