"""Retry policy (pure): after a failed attempt, retry at a time, or give up with a class.

Attempts are counted per instance and never reset: `attempts_used` is how many attempts of
this instance have run (deferrals that did not call the agent are not counted). Randomness
comes in as a `random.Random`, time as `now_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from random import Random

from taskstream.core.reasons import DEFERRED, OWNER_LOST, RELEASED, after
from taskstream.core.spec import TaskSpec
from taskstream.core.spec_parts import Backoff, RetryPolicy
from taskstream.core.states import FailClass, Status, life_began, life_start
from taskstream.core.store.records import HistoryRow


class Failure(StrEnum):
    """How an attempt failed, as far as retrying is concerned."""

    RETRIABLE = "retriable"
    TIMEOUT = "timeout"
    FATAL = "fatal"
    MANUAL_REVIEW = "manual_review"
    LOST = "lost"
    """The run lost its owner or its lease (a crash, a pause, a store outage): not the
    agent's doing, so it retries while attempts are left whatever `retry_on` says."""


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """RETRYING at `next_attempt_at_ms`, or FAILED with `fail_class`."""

    status: Status
    next_attempt_at_ms: int | None = None
    fail_class: FailClass | None = None
    delay_ms: int = 0


def backoff_ms(backoff: Backoff, jitter: float, attempts_used: int, rng: Random) -> int:
    """Delay before the next attempt, in ms: `min(max, base * factor**(n-1))` seconds, of
    which the fraction `jitter` is randomised downwards (so the delay never exceeds `max`)."""
    n = max(1, attempts_used)
    try:
        raw_s = min(backoff.max, backoff.base * backoff.factor ** (n - 1))
    except OverflowError:  # factor ** (n - 1) beyond a float: far past `max`
        raw_s = backoff.max
    delay_s = raw_s * (1.0 - jitter) + raw_s * jitter * rng.random()
    return max(0, round(delay_s * 1000))


def decide(
    failure: Failure,
    *,
    attempts_used: int,
    policy: RetryPolicy,
    now_ms: int,
    rng: Random,
) -> RetryDecision:
    """What happens after a failed attempt. `attempts_used` >= 1 includes the one that failed.

    Fatal fails now; manual review fails now (and goes to review); a retriable or timed-out
    attempt retries while attempts are left and its class is in `policy.retry_on`; a lost
    run retries while attempts are left.
    """
    if failure is Failure.FATAL:
        return RetryDecision(Status.FAILED, fail_class=FailClass.FATAL)
    if failure is Failure.MANUAL_REVIEW:
        return RetryDecision(Status.FAILED, fail_class=FailClass.MANUAL_REVIEW)
    if failure is not Failure.LOST and failure.value not in policy.retry_on:
        return RetryDecision(Status.FAILED, fail_class=FailClass.FATAL)
    if attempts_used >= policy.max_attempts:
        return RetryDecision(Status.FAILED, fail_class=FailClass.EXHAUSTED)
    delay = backoff_ms(policy.backoff, policy.jitter, attempts_used, rng)
    return RetryDecision(Status.RETRYING, next_attempt_at_ms=now_ms + delay, delay_ms=delay)


DEADLINE_REACHED = RetryDecision(Status.FAILED, fail_class=FailClass.EXHAUSTED)
"""What follows a run stopped by its instance's deadline, or a retry the deadline stops: no
attempt can start in time, so the instance fails `exhausted` (never `fatal`, whatever the
task's `retry_on`: the agent did not declare the work hopeless)."""


def deadline_passed(deadline_ms: int | None, now_ms: int) -> bool:
    """The instance's deadline (epoch ms; None: none) has come at `now_ms`."""
    return deadline_ms is not None and now_ms >= deadline_ms


def before_deadline(decision: RetryDecision, deadline_ms: int | None) -> RetryDecision:
    """`decision`, unless it plans a retry due at or after `deadline_ms` (epoch ms): a retry
    that could not start in time is not planned, and the instance fails `exhausted`."""
    due = decision.next_attempt_at_ms
    if due is not None and deadline_ms is not None and due >= deadline_ms:
        return DEADLINE_REACHED
    return decision


def attempts_used(token: int, history: list[tuple[str, int]]) -> int:
    """Attempts that count against `max_attempts` for a run holding `token`, given the
    instance's history as (reason, attempt) pairs, oldest first: attempts before the last
    manual requeue, and runs released or deferred unrun since then, do not count."""
    start = life_start([reason for reason, _ in history])
    unrun = sum(1 for reason, _ in history[start:] if reason in (RELEASED, DEFERRED))
    return token - life_began(history) - unrun


def every_run_lost(history: list[HistoryRow]) -> bool:
    """Every run since the last manual requeue ended by losing its owner (history oldest
    first): the work itself kills its executor (poison). Runs released or deferred unrun do
    not count, as in `attempts_used`; one run that failed or timed out on its own makes the
    instance merely exhausted."""
    ended = [
        h.reason
        for h in _this_life(history)
        if h.from_status is Status.RUNNING and h.reason not in (RELEASED, DEFERRED)
    ]
    return bool(ended) and all(reason == OWNER_LOST for reason in ended)


def timed_out_for(history: list[HistoryRow], attempt: int) -> str | None:
    """Why the run at `attempt` timed out: the reason of its last move into TIMEOUT (history
    oldest first), e.g. `owner_lost`; None when the history holds no such move."""
    for h in reversed(history):
        if h.to_status is Status.TIMEOUT and h.attempt == attempt:
            return h.reason
    return None


def owner_losses(history: list[HistoryRow]) -> int:
    """Runs that lost their owner since the last manual requeue (history oldest first), as
    the sweeper counts them towards `max_deliveries`: a requeue starts this count again, as
    it starts the attempt budget (`attempts_used`)."""
    return sum(1 for h in _this_life(history) if h.reason == after(OWNER_LOST))


def _this_life(history: list[HistoryRow]) -> list[HistoryRow]:
    """The rows of the instance's current life (`states.life_start`)."""
    return history[life_start([h.reason for h in history]) :]


def policy_of(spec: TaskSpec | None, max_attempts: int) -> RetryPolicy:
    """The retry policy of an instance: its task's; when no stored definition names the task,
    the default policy with the attempt limit stored with the instance (`max_attempts`)."""
    return spec.retry if spec is not None else RetryPolicy(max_attempts=max_attempts)
