"""A host whose wall clock is stepped (NTP, `date -s`), in-process: `time` as the project's
clock module sees it, with `time_ns` moved by `step_ms` and the monotonic clock untouched."""

from __future__ import annotations

import time
from typing import Any

import pytest

from taskstream.core import clock as clock_module


class SteppedTime:
    """`time`, except that `time_ns` is `step_ms` off."""

    step_ms = 0

    def time_ns(self) -> int:
        return time.time_ns() + self.step_ms * 1_000_000

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def stepped_host(monkeypatch: pytest.MonkeyPatch) -> SteppedTime:
    """Put a `SteppedTime` in place of the clock module's `time` for the test."""
    stepped = SteppedTime()
    monkeypatch.setattr(clock_module, "time", stepped)
    return stepped
