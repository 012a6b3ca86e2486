"""Pure decisions: the trigger window and how a run's end maps to the store."""

from __future__ import annotations

import pytest

from taskstream.agents.errors import FatalError, NeedsReview, RetriableError
from taskstream.core.states import FailClass, Status
from taskstream.executor.outcome import failed, succeeded
from taskstream.scheduler.decide import MISSED, SHOULD_RUN, decide_window


@pytest.mark.parametrize(
    ("fire", "now", "window", "decision"),
    [
        (1000, 1000, 0, SHOULD_RUN),
        (1000, 1500, 500, SHOULD_RUN),
        (1000, 1501, 500, MISSED),
        (1000, 900, 0, SHOULD_RUN),
    ],
)
def test_window(fire: int, now: int, window: int, decision: str) -> None:
    got = decide_window(fire, now, window)
    assert got.decision == decision
    assert got.details["window_ms"] == window


@pytest.mark.parametrize(
    ("exc", "fail_class"),
    [
        (FatalError("x"), FailClass.FATAL),
        (NeedsReview("x"), FailClass.MANUAL_REVIEW),
        (RetriableError("x"), FailClass.EXHAUSTED),
        (ValueError("x"), FailClass.EXHAUSTED),
        (TimeoutError(), FailClass.EXHAUSTED),
    ],
)
def test_failures(exc: Exception, fail_class: FailClass) -> None:
    out = failed(exc)
    assert out.status is Status.FAILED
    assert out.fail_class is fail_class
    assert out.error is not None and type(exc).__name__ in out.error


def test_success_needs_a_json_result() -> None:
    assert succeeded({"a": [1, 2]}).status is Status.SUCCESS
    bad = succeeded({"a": object()})
    assert bad.status is Status.FAILED and bad.fail_class is FailClass.FATAL
    assert succeeded(float("nan")).status is Status.FAILED
