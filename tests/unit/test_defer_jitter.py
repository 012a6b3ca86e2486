"""Deferred runs come back spread out: never earlier than the refusal's wait, at most 20% of it
(and 5 s) later, never past the instance's deadline (a wait that ends after it fails the
instance), deterministic for a seeded generator, and without spending an attempt."""

from __future__ import annotations

from random import Random

import pytest

from taskstream.core.spec_parts import RetryPolicy
from taskstream.core.states import FailClass, Status
from taskstream.executor.outcome import (
    Attempt,
    defer_jitter_max_ms,
    defer_jitter_ms,
    deferred,
    plan,
)

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("wait_ms", "most"),
    [(1, 0), (10, 2), (1_000, 200), (10_200, 2_040), (25_000, 5_000), (600_000, 5_000)],
)
def test_the_spread_is_a_fifth_of_the_wait_up_to_five_seconds(wait_ms: int, most: int) -> None:
    assert defer_jitter_max_ms(wait_ms) == most
    rng = Random(1)
    extras = [defer_jitter_ms(wait_ms, rng) for _ in range(2_000)]
    assert min(extras) >= 0 and max(extras) <= most
    if most >= 100:  # spread over the whole range, not bunched at one end
        assert min(extras) < most * 0.05 and max(extras) > most * 0.95


def test_a_deferred_run_is_due_after_its_wait_and_keeps_its_attempt() -> None:
    attempt = Attempt("i_1", token=3, attempts_used=3, policy=RetryPolicy(max_attempts=3))
    dues = set()
    for seed in range(50):
        p = plan(attempt, deferred(10_000), now_ms=NOW, rng=Random(seed))
        assert p.finish.dst is Status.RETRYING and p.finish.fail_class is None
        assert p.finish.next_attempt_at_ms is not None
        dues.add(p.finish.next_attempt_at_ms - NOW)
    assert min(dues) >= 10_000 and max(dues) <= 12_000
    assert len(dues) > 40  # runs refused together come back at different times
    again = plan(attempt, deferred(10_000), now_ms=NOW, rng=Random(7))
    assert again == plan(attempt, deferred(10_000), now_ms=NOW, rng=Random(7))


def test_a_deferral_past_the_deadline_fails_the_instance() -> None:
    policy = RetryPolicy(max_attempts=3)
    attempt = Attempt("i_1", 1, 1, policy, deadline_ms=NOW + 10_000)
    p = plan(attempt, deferred(10_000), now_ms=NOW, rng=Random(1))
    assert (p.finish.dst, p.finish.fail_class) == (Status.FAILED, FailClass.EXHAUSTED)
    assert p.finish.error is not None and "deadline" in p.finish.error
    assert p.finish.next_attempt_at_ms is None


def test_jitter_never_pushes_a_deferral_past_the_deadline() -> None:
    policy = RetryPolicy(max_attempts=3)
    attempt = Attempt("i_1", 1, 1, policy, deadline_ms=NOW + 10_500)
    for seed in range(100):
        p = plan(attempt, deferred(10_000), now_ms=NOW, rng=Random(seed))
        assert p.finish.dst is Status.RETRYING and p.finish.next_attempt_at_ms is not None
        assert NOW + 10_000 <= p.finish.next_attempt_at_ms < NOW + 10_500
