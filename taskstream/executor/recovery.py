"""Taking work back from a run that lost its owner or its lease: CAS RUNNING -> TIMEOUT (with
the run's token), then RETRYING with backoff or FAILED when attempts are spent. Used by the
sweeper (pending entries) and the reconciler (rows whose entry is gone)."""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

from taskstream.core.definitions import DefinitionCache
from taskstream.core.logging import get_logger
from taskstream.core.reasons import LEASE_EXPIRED, OWNER_LOST, after
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow, Store
from taskstream.executor.retry import (
    DEADLINE_REACHED,
    Failure,
    RetryDecision,
    attempts_used,
    before_deadline,
    deadline_passed,
    decide,
    every_run_lost,
    policy_of,
    timed_out_for,
)


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recovery did: `ok` False when the row moved on meanwhile (nothing changed)."""

    ok: bool
    decision: RetryDecision | None = None


class Recovery:
    """Times out runs whose owner or lease is gone and decides their retry."""

    def __init__(self, store: Store, defs: DefinitionCache, rng: Random) -> None:
        self._store, self._defs, self._rng = store, defs, rng
        self._log = get_logger(role="sweeper")

    async def time_out(self, row: InstanceRow, *, reason: str, now_ms: int) -> Recovered:
        """RUNNING (attempt = row.attempt) -> TIMEOUT -> RETRYING | FAILED, only while the
        lease is still as `row` shows it: a heartbeat that extended it since the row was read
        proves its owner alive, and the run is left to it (`ok` False)."""
        cas = await self._store.transition(
            row.id,
            Status.RUNNING,
            Status.TIMEOUT,
            reason=reason,
            attempt=row.attempt,
            owner=row.lease_owner,
            lease_until=row.lease_expires_at_ms,
        )
        if not cas.ok:
            return Recovered(ok=False)
        return await self.leave_timeout(row, reason=reason, now_ms=now_ms)

    async def leave_timeout(
        self, row: InstanceRow, *, now_ms: int, reason: str | None = None
    ) -> Recovered:
        """TIMEOUT -> RETRYING (backoff) or FAILED (exhausted; poison when every run so far
        lost its owner; fatal when the run hit its own timeout and the task's `retry_on` has
        no `timeout`, unless the deadline has passed: no retry can follow, so exhausted).
        `reason`: why the run timed out; None (a TIMEOUT left behind when the second move
        failed) reads it from the move into TIMEOUT, so an `owner_lost` run still counts as
        one that lost its owner and a `timeout` run as one that timed out."""
        policy = policy_of(self._defs.get(row.task_id), row.max_attempts)
        rows = await self._store.history(row.id)
        if reason is None:
            reason = timed_out_for(rows, row.attempt) or LEASE_EXPIRED
        history = [(h.reason, h.attempt) for h in rows]
        # A run past its own timeout stays under the task's `retry_on`; only a lost one does not.
        failure = Failure.TIMEOUT if reason == Failure.TIMEOUT else Failure.LOST
        decided = decide(
            failure,
            attempts_used=attempts_used(row.attempt, history),
            policy=policy,
            now_ms=now_ms,
            rng=self._rng,
        )
        decision = before_deadline(decided, row.deadline_ms)
        if failure is Failure.TIMEOUT and deadline_passed(row.deadline_ms, now_ms):
            decision = DEADLINE_REACHED  # as the executor ends a run stopped at its deadline
        # Poison only when the attempts ran out, not when the deadline stopped a retry.
        if decided.status is Status.FAILED and reason == OWNER_LOST and every_run_lost(rows):
            decision = RetryDecision(Status.FAILED, fail_class=FailClass.POISON)
        cas = await self._store.transition(
            row.id,
            Status.TIMEOUT,
            decision.status,
            reason=after(reason),
            attempt=row.attempt,
            fail_class=decision.fail_class,
            next_attempt_at_ms=decision.next_attempt_at_ms,
        )
        self._log.info(
            "instance.recovered",
            instance_id=row.id,
            attempt=row.attempt,
            reason=reason,
            status=decision.status,
            ok=cas.ok,
        )
        return Recovered(ok=cas.ok, decision=decision)
