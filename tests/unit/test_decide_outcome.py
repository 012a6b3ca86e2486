"""Pure decisions: how a run's end maps to store writes."""

from __future__ import annotations

from random import Random
from typing import Literal

import pytest

from taskstream.agents.errors import FatalError, NeedsReview, RetriableError
from taskstream.core.spec_parts import Backoff, RetryPolicy
from taskstream.core.states import FailClass, Status
from taskstream.executor.outcome import (
    MAX_RESULT_BYTES,
    Attempt,
    RunEnd,
    deferred,
    failed,
    final,
    plan,
    succeeded,
    timed_out,
)
from taskstream.executor.retry import Failure

POLICY = RetryPolicy(max_attempts=3, backoff=Backoff(base=1.0, factor=2.0, max=60.0), jitter=0)


@pytest.mark.parametrize(
    ("exc", "failure"),
    [
        (FatalError("x"), Failure.FATAL),
        (NeedsReview("x"), Failure.MANUAL_REVIEW),
        (RetriableError("x"), Failure.RETRIABLE),
        (ValueError("x"), Failure.RETRIABLE),
        (TimeoutError(), Failure.RETRIABLE),  # the agent's own, not its attempt's limit
    ],
)
def test_exceptions_are_classified(exc: Exception, failure: Failure) -> None:
    end = failed(exc)
    assert end.failure is failure
    assert end.error is not None and type(exc).__name__ in end.error


def test_success_needs_a_json_result() -> None:
    assert succeeded({"a": [1, 2]}).failure is None
    assert succeeded({"a": object()}).failure is Failure.FATAL
    assert succeeded(float("nan")).failure is Failure.FATAL


def test_a_result_the_store_cannot_keep_is_a_fatal_failure() -> None:
    """Not UTF-8 encodable (a lone surrogate) or over the size limit: it would fail its
    commit, and its batch, every time."""
    surrogate = succeeded({"text": "\ud83d"})
    assert (surrogate.reason, surrogate.failure) == ("result_not_json", Failure.FATAL)
    big = succeeded("é" * (MAX_RESULT_BYTES // 2 + 1))  # 2 bytes each in UTF-8
    assert (big.reason, big.failure) == ("result_too_large", Failure.FATAL)
    assert big.error is not None and str(MAX_RESULT_BYTES) in big.error
    assert succeeded("é" * (MAX_RESULT_BYTES // 2 - 1)).failure is None


def test_a_result_nested_too_deep_to_encode_is_a_fatal_failure() -> None:
    """Retried, it would run the agent (and its side effects) again for the same end."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    end = succeeded(deep)
    assert (end.reason, end.failure) == ("result_not_json", Failure.FATAL)


def test_keys_that_do_not_sort_are_a_fatal_failure() -> None:
    """The store keeps JSON with sorted keys: a dict mixing int and str keys has no such
    text, so it would fail its commit every time (and be retried until exhausted)."""
    mixed = succeeded({1: "a", "b": 2})
    assert (mixed.reason, mixed.failure) == ("result_not_json", Failure.FATAL)


def test_a_result_is_encoded_once_as_the_store_keeps_it() -> None:
    end = succeeded({"b": [1, 2.5], "a": "é"})
    assert end.result_json == '{"a":"é","b":[1,2.5]}'
    finish = plan(attempt(1), end, now_ms=0, rng=Random(0)).finish
    assert (finish.result, finish.result_json) == (end.result, end.result_json)
    assert succeeded(None).result_json is None


def attempt(used: int, deadline_ms: int | None = None) -> Attempt:
    return Attempt("i1", token=used, attempts_used=used, policy=POLICY, deadline_ms=deadline_ms)


@pytest.mark.parametrize(
    ("end", "used", "dst", "fail_class", "next_at"),
    [
        (succeeded(1), 1, Status.SUCCESS, None, None),
        (failed(ValueError()), 1, Status.RETRYING, None, 11_000),
        (failed(ValueError()), 2, Status.RETRYING, None, 12_000),
        (failed(ValueError()), 3, Status.FAILED, FailClass.EXHAUSTED, None),
        (failed(FatalError()), 1, Status.FAILED, FailClass.FATAL, None),
        (failed(NeedsReview()), 1, Status.FAILED, FailClass.MANUAL_REVIEW, None),
        (
            final("payload_too_large", FailClass.POISON, "big"),
            1,
            Status.FAILED,
            FailClass.POISON,
            None,
        ),
    ],
)
def test_plans(
    end: RunEnd, used: int, dst: Status, fail_class: FailClass | None, next_at: int | None
) -> None:
    got = plan(attempt(used), end, now_ms=10_000, rng=Random(0))
    assert (got.finish.dst, got.finish.fail_class, got.finish.next_attempt_at_ms) == (
        dst,
        fail_class,
        next_at,
    )
    assert got.finish.token == used
    assert got.after_timeout is None


def test_only_a_review_failure_asks_for_a_review_entry() -> None:
    review = plan(attempt(1), failed(NeedsReview("unsure")), now_ms=0, rng=Random(0))
    assert (review.finish.fail_class, review.finish.review) == (
        FailClass.MANUAL_REVIEW,
        "NeedsReview: unsure",
    )
    for end in (failed(FatalError("no")), failed(ValueError()), succeeded(1)):
        assert plan(attempt(1), end, now_ms=0, rng=Random(0)).finish.review is None


def test_timeout_goes_through_timeout_then_retries_or_fails() -> None:
    got = plan(attempt(1), timed_out("limit"), now_ms=0, rng=Random(0))
    assert got.finish.dst is Status.TIMEOUT
    assert got.after_timeout is not None and got.after_timeout.status is Status.RETRYING
    last = plan(attempt(3), timed_out("limit"), now_ms=0, rng=Random(0))
    assert last.after_timeout is not None and last.after_timeout.status is Status.FAILED


@pytest.mark.parametrize("retry_on", [("retriable",), ("retriable", "timeout")])
def test_a_timeout_at_the_deadline_is_exhausted_whatever_retry_on(
    retry_on: tuple[Literal["retriable", "timeout"], ...],
) -> None:
    """No retry can follow a run stopped at its deadline: `exhausted`, not `fatal` for a task
    whose `retry_on` leaves timeouts out, though attempts are left."""
    policy = POLICY.model_copy(update={"retry_on": retry_on})
    at = Attempt("i1", token=1, attempts_used=1, policy=policy, deadline_ms=10_000)
    got = plan(at, timed_out("limit", at_deadline=True), now_ms=10_000, rng=Random(0))
    assert got.finish.dst is Status.TIMEOUT
    assert got.after_timeout is not None
    assert (got.after_timeout.status, got.after_timeout.fail_class) == (
        Status.FAILED,
        FailClass.EXHAUSTED,
    )


def test_a_timeout_error_the_agent_raised_is_an_ordinary_retriable_failure() -> None:
    """Only the attempt's own limit is a timeout: a socket's or an inner `wait_for`'s
    `TimeoutError` is an unexpected error, retried as `retriable`, with no TIMEOUT move."""
    got = plan(attempt(1), failed(TimeoutError("read")), now_ms=0, rng=Random(0))
    assert (got.finish.dst, got.after_timeout) == (Status.RETRYING, None)
    assert got.finish.error == "TimeoutError: read"


def test_no_retry_is_planned_past_the_deadline() -> None:
    got = plan(attempt(1, deadline_ms=10_500), failed(ValueError()), now_ms=10_000, rng=Random(0))
    assert (got.finish.dst, got.finish.fail_class) == (Status.FAILED, FailClass.EXHAUSTED)


@pytest.mark.parametrize(
    "end",
    [
        succeeded(1),
        failed(ValueError()),
        failed(FatalError()),
        timed_out("limit"),
        deferred(5_000),
    ],
)
def test_every_plan_names_the_attempts_owner(end: RunEnd) -> None:
    owner_attempt = Attempt("i1", token=1, attempts_used=1, policy=POLICY, owner="host:1:2")

    finish = plan(owner_attempt, end, now_ms=10_000, rng=Random(1)).finish

    assert (finish.instance_id, finish.token, finish.owner) == ("i1", 1, "host:1:2")


def test_side_effect_keys_fit_the_store() -> None:
    from taskstream.agents.base import effect_key
    from taskstream.core.store.tables import KEY_LEN

    assert effect_key("daily:2026-12-01", "send") == "daily:2026-12-01:send"
    long_a, long_b = effect_key("k" * 251, "send"), effect_key("k" * 251, "sent")
    assert long_a.startswith("sha256:") and len(long_a) <= KEY_LEN
    assert long_a != long_b
    assert effect_key("k" * 251, "send") == long_a
    # Not UTF-8 (a file name decoded with surrogateescape): stored as its digest, which every
    # store takes, instead of a key MariaDB refuses at the commit, after the effect.
    odd_a, odd_b = effect_key("daily", "upload-\udcff"), effect_key("daily", "upload-\udcfe")
    assert odd_a.startswith("sha256:") and odd_a != odd_b
    odd_a.encode("utf-8")
    # A NUL, which PostgreSQL's text refuses: digested too.
    nul = effect_key("daily", "upload-\x00")
    assert nul.startswith("sha256:") and nul != effect_key("daily", "upload-")
    assert effect_key("daily", "résumé-📄") == "daily:résumé-📄"


@pytest.mark.parametrize(
    ("asked", "kept"),
    [
        (30_000, 30_000),
        (10**20, 3_600_000),
        (1e20, 3_600_000),
        (float("inf"), 3_600_000),
        (-5, 0),
        (float("nan"), None),
    ],
)
def test_an_agents_own_retry_after_is_bounded_to_an_hour(asked: float, kept: int | None) -> None:
    """As an upstream's `Retry-After` is: a decade's wait would hide the instance, and a
    value past the store's column would make its commit fail."""
    end = failed(RetriableError("busy", retry_after_ms=asked))  # type: ignore[arg-type]
    assert end.retry_after_ms == kept


@pytest.mark.parametrize(
    ("wait_ms", "kept"),
    [(0, 1), (5_000, 5_000), (10**20, 7 * 86_400_000), (float("inf"), 7 * 86_400_000)],
)
def test_a_deferral_is_bounded(wait_ms: float, kept: int) -> None:
    assert deferred(wait_ms).defer_ms == kept  # type: ignore[arg-type]


def test_an_end_the_store_refused_becomes_a_fatal_failure_then_loses_its_effect_keys() -> None:
    """First the run's end without its result (the effect keys kept, so a retry by hand does
    not repeat them); refused again, without the keys too; then nothing is left to drop."""
    from taskstream.core.store.port import FinishRequest
    from taskstream.executor.outcome import COMMIT_REFUSED, Plan, refused_plan

    ended = Plan(
        FinishRequest(
            "i1",
            2,
            Status.SUCCESS,
            "completed",
            result={"x": 1},
            side_effects=("k:send",),
            owner="o",
        )
    )
    first = refused_plan(ended, "DataError: (1366, 'Incorrect string value')")
    assert first is not None
    f = first.finish
    assert (f.dst, f.reason, f.fail_class, f.result, f.side_effects, f.token, f.owner) == (
        Status.FAILED,
        COMMIT_REFUSED,
        FailClass.FATAL,
        None,
        ("k:send",),
        2,
        "o",
    )
    assert f.error is not None and "SUCCESS completed" in f.error and "1366" in f.error
    second = refused_plan(first, "again")
    assert second is not None and second.finish.side_effects == ()
    assert second.finish.error == f.error
    assert refused_plan(second, "again") is None
