"""The retry policy against a spec table; randomness and time passed in."""

from __future__ import annotations

from random import Random
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.reasons import (
    DEFERRED,
    LEASE_EXPIRED,
    OWNER_LOST,
    RELEASED,
    REQUEUED,
    after,
)
from taskstream.core.spec_parts import Backoff, RetryPolicy
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import HistoryRow
from taskstream.executor.retry import (
    Failure,
    RetryDecision,
    backoff_ms,
    before_deadline,
    decide,
    every_run_lost,
    owner_losses,
    timed_out_for,
)

NO_JITTER = RetryPolicy(max_attempts=6, backoff=Backoff(base=1.0, factor=2.0, max=10.0), jitter=0)


@pytest.mark.parametrize(
    ("attempts_used", "delay_ms"),
    [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 10_000)],
)
def test_backoff_table_without_jitter(attempts_used: int, delay_ms: int) -> None:
    got = decide(
        Failure.RETRIABLE, attempts_used=attempts_used, policy=NO_JITTER, now_ms=500, rng=Random(1)
    )
    assert got.status is Status.RETRYING
    assert got.delay_ms == delay_ms
    assert got.next_attempt_at_ms == 500 + delay_ms


def test_jitter_sequence_is_reproducible_and_bounded() -> None:
    backoff = Backoff(base=10.0, factor=3.0, max=600.0)
    first = [backoff_ms(backoff, 0.5, n, Random(42)) for n in range(1, 6)]
    again = [backoff_ms(backoff, 0.5, n, Random(42)) for n in range(1, 6)]
    assert first == again
    raws = [10_000, 30_000, 90_000, 270_000, 600_000]
    for got, raw in zip(first, raws, strict=True):
        assert raw * 0.5 <= got <= raw


@given(
    n=st.integers(min_value=1, max_value=60),
    jitter=st.floats(min_value=0, max_value=1),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_never_exceeds_max(n: int, jitter: float, seed: int) -> None:
    backoff = Backoff(base=0.5, factor=2.5, max=30.0)
    assert 0 <= backoff_ms(backoff, jitter, n, Random(seed)) <= 30_000


@pytest.mark.parametrize(
    ("failure", "used", "status", "fail_class"),
    [
        (Failure.FATAL, 1, Status.FAILED, FailClass.FATAL),
        (Failure.MANUAL_REVIEW, 1, Status.FAILED, FailClass.MANUAL_REVIEW),
        (Failure.RETRIABLE, 5, Status.RETRYING, None),
        (Failure.RETRIABLE, 6, Status.FAILED, FailClass.EXHAUSTED),
        (Failure.TIMEOUT, 6, Status.FAILED, FailClass.EXHAUSTED),
        (Failure.TIMEOUT, 2, Status.RETRYING, None),
    ],
)
def test_classes(failure: Failure, used: int, status: Status, fail_class: FailClass | None) -> None:
    got = decide(failure, attempts_used=used, policy=NO_JITTER, now_ms=0, rng=Random(0))
    assert (got.status, got.fail_class) == (status, fail_class)


def test_a_class_not_in_retry_on_fails_at_once() -> None:
    policy = RetryPolicy(max_attempts=5, retry_on=("retriable",))
    got = decide(Failure.TIMEOUT, attempts_used=1, policy=policy, now_ms=0, rng=Random(0))
    assert got.status is Status.FAILED


@pytest.mark.parametrize("retry_on", [("retriable",), ("timeout",)])
def test_a_lost_run_retries_on_its_budget_whatever_retry_on_says(
    retry_on: tuple[Literal["retriable", "timeout"], ...],
) -> None:
    """A crash or a lapsed lease is not the agent's failure: `retry_on` does not filter it."""
    policy = RetryPolicy(max_attempts=3, retry_on=retry_on)
    used = [
        decide(Failure.LOST, attempts_used=n, policy=policy, now_ms=0, rng=Random(0))
        for n in (1, 2, 3)
    ]
    assert [(d.status, d.fail_class) for d in used] == [
        (Status.RETRYING, None),
        (Status.RETRYING, None),
        (Status.FAILED, FailClass.EXHAUSTED),
    ]


@given(used=st.integers(min_value=1, max_value=50), max_attempts=st.integers(1, 20))
def test_max_attempts_is_never_exceeded(used: int, max_attempts: int) -> None:
    policy = RetryPolicy(max_attempts=max_attempts)
    got = decide(Failure.RETRIABLE, attempts_used=used, policy=policy, now_ms=0, rng=Random(0))
    assert (got.status is Status.RETRYING) == (used < max_attempts)


@pytest.mark.parametrize(
    ("token", "history", "used"),
    [
        (1, [], 1),
        (3, [("claimed", 1), ("released", 1), ("claimed", 2)], 2),
        (5, [("released", 1), ("requeued", 3), ("claimed", 4), ("released", 4)], 1),
        (4, [("requeued", 3)], 1),
    ],
)
def test_attempts_used(token: int, history: list[tuple[str, int]], used: int) -> None:
    from taskstream.executor.retry import attempts_used

    assert attempts_used(token, history) == used


def test_a_backoff_past_any_float_is_its_max() -> None:
    """factor ** (attempts - 1) overflows a float long before `max_attempts`' limit."""
    backoff = Backoff(base=1.0, factor=1000.0, max=600.0)
    assert backoff_ms(backoff, 0.0, 10_000, Random(1)) == 600_000


def _h(src: Status | None, dst: Status, attempt: int, reason: str) -> HistoryRow:
    return HistoryRow("i", src, dst, attempt, None, reason, 0)


RUN, RETRY, TIMEOUT = Status.RUNNING, Status.RETRYING, Status.TIMEOUT


@pytest.mark.parametrize(
    ("ends", "poison"),
    [
        ([(RUN, TIMEOUT, 1, OWNER_LOST), (RUN, TIMEOUT, 2, OWNER_LOST)], True),
        ([(RUN, RETRY, 1, "failed"), (RUN, TIMEOUT, 2, OWNER_LOST)], False),
        ([(RUN, TIMEOUT, 1, LEASE_EXPIRED), (RUN, TIMEOUT, 2, OWNER_LOST)], False),
        ([(RUN, RETRY, 1, RELEASED), (RUN, TIMEOUT, 2, OWNER_LOST)], True),
        ([(RUN, RETRY, 1, DEFERRED), (RUN, TIMEOUT, 2, OWNER_LOST)], True),
        (
            [
                (RUN, RETRY, 1, "failed"),
                (Status.FAILED, Status.PENDING, 2, REQUEUED),
                (RUN, TIMEOUT, 3, OWNER_LOST),
            ],
            True,
        ),
        ([(RUN, RETRY, 1, RELEASED)], False),
        ([], False),
    ],
)
def test_poison_only_when_every_run_since_the_last_requeue_lost_its_owner(
    ends: list[tuple[Status, Status, int, str]], poison: bool
) -> None:
    history = [_h(None, Status.PENDING, 0, "created"), *(_h(*e) for e in ends)]
    assert every_run_lost(history) is poison


def test_owner_losses_count_again_from_the_last_requeue() -> None:
    lost = [_h(RUN, TIMEOUT, n, OWNER_LOST) for n in (1, 2)]
    moved_on = [_h(TIMEOUT, RETRY, n, after(OWNER_LOST)) for n in (1, 2)]
    history = [_h(None, Status.PENDING, 0, "created"), lost[0], moved_on[0], lost[1], moved_on[1]]
    assert owner_losses(history) == 2
    requeued = _h(Status.FAILED, Status.PENDING, 2, REQUEUED)
    assert owner_losses([*history, requeued]) == 0
    again = _h(TIMEOUT, RETRY, 3, after(OWNER_LOST))
    assert owner_losses([*history, requeued, again]) == 1
    assert owner_losses([*history, _h(TIMEOUT, RETRY, 3, after(LEASE_EXPIRED))]) == 2


@pytest.mark.parametrize(
    ("due_ms", "deadline_ms", "kept"),
    [(4_999, 5_000, True), (5_000, 5_000, False), (30_000, 5_000, False), (30_000, None, True)],
)
def test_a_retry_due_at_or_after_the_deadline_is_not_planned(
    due_ms: int, deadline_ms: int | None, kept: bool
) -> None:
    retry = RetryDecision(Status.RETRYING, next_attempt_at_ms=due_ms, delay_ms=due_ms)
    exhausted = RetryDecision(Status.FAILED, fail_class=FailClass.EXHAUSTED)
    assert before_deadline(retry, deadline_ms) == (retry if kept else exhausted)
    fatal = RetryDecision(Status.FAILED, fail_class=FailClass.FATAL)
    assert before_deadline(fatal, deadline_ms) == fatal


def test_a_run_timed_out_for_the_reason_of_its_own_move_into_timeout() -> None:
    history = [
        _h(None, Status.PENDING, 0, "created"),
        _h(RUN, TIMEOUT, 1, LEASE_EXPIRED),
        _h(TIMEOUT, RETRY, 1, after(LEASE_EXPIRED)),
        _h(RUN, TIMEOUT, 2, OWNER_LOST),
    ]
    assert timed_out_for(history, 2) == OWNER_LOST
    assert timed_out_for(history, 1) == LEASE_EXPIRED
    assert timed_out_for(history, 3) is None
