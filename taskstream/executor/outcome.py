"""How a finished run maps to the store (pure): the final status, fail class and error text.

Retries with backoff build on this: a retriable failure with attempts left becomes RETRYING.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from taskstream.agents.errors import FatalError, NeedsReview, RetriableError
from taskstream.core.states import FailClass, Status

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Outcome:
    """The final CAS of a run: RUNNING -> `status`."""

    status: Status
    reason: str
    result: Any = None
    fail_class: FailClass | None = None
    error: str | None = None


def succeeded(result: Any) -> Outcome:
    """A run that returned. A result that is not JSON is a fatal failure, not a success."""
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return Outcome(Status.FAILED, "result_not_json", None, FailClass.FATAL, str(exc)[:200])
    return Outcome(Status.SUCCESS, "completed", result)


def failed(exc: BaseException) -> Outcome:
    """A run that raised. Typed agent errors choose the class; anything else is unexpected."""
    error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    if isinstance(exc, TimeoutError):
        return Outcome(Status.FAILED, "timeout", None, FailClass.EXHAUSTED, error)
    if isinstance(exc, NeedsReview):
        return Outcome(Status.FAILED, "needs_review", None, FailClass.MANUAL_REVIEW, error)
    if isinstance(exc, FatalError):
        return Outcome(Status.FAILED, "fatal_error", None, FailClass.FATAL, error)
    reason = "retriable_error" if isinstance(exc, RetriableError) else "unexpected_error"
    return Outcome(Status.FAILED, reason, None, FailClass.EXHAUSTED, error)
