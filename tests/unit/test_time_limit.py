"""An attempt's time limit: the task's timeout, or the time left before the deadline."""

from __future__ import annotations

from taskstream.executor.runner import time_limit


def test_the_sooner_of_timeout_and_deadline_limits_the_attempt() -> None:
    assert time_limit(30.0, None, 1_000).seconds == 30.0
    assert (time_limit(30.0, 61_000, 1_000).source, time_limit(30.0, 61_000, 1_000).seconds) == (
        "timeout",
        30.0,
    )
    near = time_limit(30.0, 1_300, 1_000)
    assert (near.source, near.seconds) == ("deadline", 0.3)
    assert near.expired() == "the attempt ran past its deadline (0.3 s)"
    assert time_limit(30.0, 900, 1_000).seconds < 0
