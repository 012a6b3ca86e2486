"""How a finished run maps to the store (pure): the final CAS and, after a timeout, the
follow-up move out of TIMEOUT.

A run ends in success, or in a failure with a class (`retry.Failure`). The retry policy then
chooses RETRYING (attempts left, class retries, next attempt before the deadline) or FAILED.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from random import Random
from typing import Any

from taskstream.agents.errors import FatalError, NeedsReview, RetriableError
from taskstream.core.reasons import DEFERRED
from taskstream.core.spec_parts import RetryPolicy
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import FinishRequest
from taskstream.core.store.records import stored_json, utf8_size
from taskstream.executor.retry import (
    DEADLINE_REACHED,
    Failure,
    RetryDecision,
    before_deadline,
    decide,
)

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How one attempt ended: a JSON result, or a failure class with its error text."""

    reason: str
    result: Any = None
    result_json: str | None = None
    """The result as the store keeps it (`stored_json`), encoded once when it was checked."""
    failure: Failure | None = None
    error: str | None = None
    fail_class: FailClass | None = None
    """Set when the end is final whatever the policy says (poison, bad params)."""
    defer_ms: int | None = None
    """Set when the run never called its agent (upstream refused): retry after this wait."""
    retry_after_ms: int | None = None
    """Set when the failure asked for a pause (an upstream's Retry-After): a retry waits at
    least this long (ms), or the backoff when that is longer."""
    at_deadline: bool = False
    """Set for a timeout at the instance's deadline (the attempt's limit was the deadline, or
    the deadline passed before the run started): no retry can follow it."""


MAX_RESULT_BYTES = 4 * 1024 * 1024
"""Largest result a run may return, as stored (UTF-8 JSON): a larger one could not be sent
in one statement (MariaDB's default packet limit is 16 MiB, counted in utf8mb4)."""


def succeeded(result: Any) -> RunEnd:
    """A run that returned. Its result is encoded once, as the store keeps it. A result the
    store cannot keep (not JSON, keys that do not sort, not UTF-8 encodable, nested too deep
    to encode, over `MAX_RESULT_BYTES`) is a fatal failure, not a success: it would fail its
    commit every time, and its batch with it."""
    try:
        text = None if result is None else stored_json(result)
        size = 0 if text is None else utf8_size(text)
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError: ValueError
        return RunEnd("result_not_json", failure=Failure.FATAL, error=str(exc)[:200])
    if size > MAX_RESULT_BYTES:
        error = f"result is {size} bytes, limit {MAX_RESULT_BYTES}"
        return RunEnd("result_too_large", failure=Failure.FATAL, error=error)
    return RunEnd("completed", result=result, result_json=text)


def timed_out(why: str, *, at_deadline: bool = False) -> RunEnd:
    """A run past its attempt's limit (its `timeout`, or the time left before its deadline:
    `at_deadline`); `why` names the limit. Only the executor's own limit ends a run so: a
    `TimeoutError` the agent's code raises (a socket's, an inner `wait_for`) is an unexpected
    error like any other, see `failed`."""
    error = f"TimeoutError: {why}"
    return RunEnd("timeout", failure=Failure.TIMEOUT, error=error, at_deadline=at_deadline)


def failed(exc: BaseException) -> RunEnd:
    """A run that raised. Typed agent errors choose the class; anything else is retriable."""
    error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    if isinstance(exc, NeedsReview):
        return RunEnd("needs_review", failure=Failure.MANUAL_REVIEW, error=error)
    if isinstance(exc, FatalError):
        return RunEnd("fatal_error", failure=Failure.FATAL, error=error)
    asked = exc.retry_after_ms if isinstance(exc, RetriableError) else None
    wait_ms = None if asked is None else _bounded(asked, MAX_AGENT_RETRY_AFTER_MS)
    return RunEnd("retriable_error", failure=Failure.RETRIABLE, error=error, retry_after_ms=wait_ms)


def deferred(wait_ms: int) -> RunEnd:
    """A run its upstream's limiter or breaker refused: not an attempt, retried later (in
    1 ms to `MAX_DEFER_MS`)."""
    return RunEnd(DEFERRED, defer_ms=max(1, _bounded(wait_ms, MAX_DEFER_MS) or 0))


MAX_AGENT_RETRY_AFTER_MS = 3_600_000
"""The longest wait before the next attempt that an agent's `RetriableError` may ask for (ms),
as the HTTP client caps an upstream's `Retry-After`."""
MAX_DEFER_MS = 7 * 86_400_000
"""The longest deferral (ms): far past any breaker cool-down. A longer one (an agent's own
`UpstreamDeferred`) would only hide the run, or not fit the store's column."""


def _bounded(wait_ms: float, most: int) -> int | None:
    """`wait_ms` as whole ms within 0..`most`: `most` for an endless wait (infinity), None
    when it is not a number."""
    if wait_ms == math.inf:  # asked to wait for ever: the longest wait allowed, not none
        return most
    try:
        value = int(wait_ms)
    except (TypeError, ValueError, OverflowError):  # None, NaN, infinity
        return None
    return min(most, max(0, value))


DEFER_JITTER = 0.2
"""Deferred runs are due up to this fraction of their wait later than the slot or breaker
frees (at most `DEFER_JITTER_MAX_MS`), so runs refused together do not all come back at the
same instant, where all but one would be refused again."""
DEFER_JITTER_MAX_MS = 5_000


def defer_jitter_max_ms(wait_ms: int) -> int:
    """The largest extra delay (ms) of a run deferred by `wait_ms`."""
    return round(min(wait_ms * DEFER_JITTER, DEFER_JITTER_MAX_MS))


def defer_jitter_ms(wait_ms: int, rng: Random) -> int:
    """The extra delay (ms, 0 to `defer_jitter_max_ms`) of a run deferred by `wait_ms`."""
    return round(rng.uniform(0, defer_jitter_max_ms(wait_ms)))


def final(reason: str, fail_class: FailClass, error: str) -> RunEnd:
    """An end that no retry can change (poison entry, params that do not validate)."""
    return RunEnd(
        reason, failure=Failure.FATAL, error=error[:MAX_ERROR_CHARS], fail_class=fail_class
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """The final CAS, and for a timeout the move out of TIMEOUT that follows it."""

    finish: FinishRequest
    after_timeout: RetryDecision | None = None

    @property
    def retries(self) -> bool:
        """The plan leaves the instance RETRYING (the scheduler must learn its due time)."""
        after = self.after_timeout
        return self.finish.dst is Status.RETRYING or (
            after is not None and after.status is Status.RETRYING
        )

    def with_effects(self, side_effects: list[str]) -> Plan:
        """This plan with the run's side-effect keys written by its final CAS."""
        if not side_effects:
            return self
        return replace(self, finish=replace(self.finish, side_effects=tuple(side_effects)))


@dataclass(frozen=True, slots=True)
class Attempt:
    """The run being finished: its instance, fencing token and limits, and the lease owner
    that claimed it at this token (named in the finish's history row)."""

    instance_id: str
    token: int
    attempts_used: int
    policy: RetryPolicy
    deadline_ms: int | None = None
    owner: str | None = None


def plan(attempt: Attempt, end: RunEnd, *, now_ms: int, rng: Random) -> Plan:
    """The store writes for `end`. `now_ms` is the database-synchronised clock."""
    base = FinishRequest(
        attempt.instance_id,
        attempt.token,
        Status.SUCCESS,
        end.reason,
        result=end.result,
        error=end.error,
        owner=attempt.owner,
        result_json=end.result_json,
    )
    if end.defer_ms is not None:
        return Plan(_deferral(base, attempt, end.defer_ms, now_ms, rng))
    if end.failure is None:
        return Plan(base)
    if end.fail_class is not None:
        return Plan(_failed(base, end.fail_class))
    decision = _retry(attempt, end.failure, now_ms, rng, end.retry_after_ms or 0)
    if end.failure is Failure.TIMEOUT:
        # At the deadline no retry can be planned, whatever `retry_on` says of timeouts.
        after = DEADLINE_REACHED if end.at_deadline else decision
        return Plan(replace(base, dst=Status.TIMEOUT), after_timeout=after)
    if decision.fail_class is not None:
        return Plan(_failed(base, decision.fail_class))
    return Plan(replace(base, dst=decision.status, next_attempt_at_ms=decision.next_attempt_at_ms))


def _failed(base: FinishRequest, fail_class: FailClass) -> FinishRequest:
    """FAILED with `fail_class`; a `manual_review` failure also queues the instance for review
    (in the same transaction), with the run's error as the reason."""
    review = base.error or base.reason if fail_class is FailClass.MANUAL_REVIEW else None
    return replace(base, dst=Status.FAILED, fail_class=fail_class, review=review)


def _deferral(
    base: FinishRequest, attempt: Attempt, wait_ms: int, now_ms: int, rng: Random
) -> FinishRequest:
    """RETRYING after `wait_ms` plus jitter (never past the deadline); FAILED `exhausted` when
    the upstream frees only at or after the instance's deadline, where waiting cannot help."""
    due = now_ms + wait_ms
    deadline = attempt.deadline_ms
    if deadline is not None and due >= deadline:
        error = f"the upstream frees in {wait_ms} ms, at or after the deadline"
        return replace(base, dst=Status.FAILED, fail_class=FailClass.EXHAUSTED, error=error)
    due += defer_jitter_ms(wait_ms, rng)
    if deadline is not None:
        due = min(due, deadline - 1)
    return replace(base, dst=Status.RETRYING, next_attempt_at_ms=due)


def _retry(
    attempt: Attempt, failure: Failure, now_ms: int, rng: Random, min_delay_ms: int = 0
) -> RetryDecision:
    decision = decide(
        failure, attempts_used=attempt.attempts_used, policy=attempt.policy, now_ms=now_ms, rng=rng
    )
    due = decision.next_attempt_at_ms
    if due is not None and decision.delay_ms < min_delay_ms:
        due = now_ms + min_delay_ms
        decision = replace(decision, next_attempt_at_ms=due, delay_ms=min_delay_ms)
    return before_deadline(decision, attempt.deadline_ms)


COMMIT_REFUSED = "commit_refused"


def refused_plan(refused: Plan, why: str) -> Plan | None:
    """What to commit instead of a run's end that the store refused (a value it will not
    take; `why` names it): FAILED `fatal`, no result, the error saying what was refused, so
    the run ends explained instead of staying RUNNING for its lease to lapse and the agent
    to run again. Its side-effect keys are kept; refused too, they are dropped (such keys
    cannot guard their effects anyway). None when nothing is left to drop."""
    finish = refused.finish
    if finish.reason != COMMIT_REFUSED:
        error = f"the store refused this run's end ({finish.dst} {finish.reason}): {why}"
        return Plan(
            replace(
                finish,
                dst=Status.FAILED,
                reason=COMMIT_REFUSED,
                result=None,
                result_json=None,
                fail_class=FailClass.FATAL,
                error=error[:MAX_ERROR_CHARS],
                next_attempt_at_ms=None,
                review=None,
            )
        )
    if finish.side_effects:
        return Plan(replace(finish, side_effects=()))
    return None
