"""Trigger decision for one tick (pure): is the fire time still inside its trigger window?

Decision names are the explain log's vocabulary (DESIGN.md §7).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

SHOULD_RUN: Final = "should_run"
SKIP_DUPLICATED: Final = "skip_duplicated"
MISSED: Final = "missed"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one fire time, why, and the values the rule saw."""

    decision: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        return self.decision == SHOULD_RUN


def decide_window(fire_ms: int, now_ms: int, window_ms: int) -> Decision:
    """Run while `now_ms <= fire_ms + window_ms`; later than that the tick was missed."""
    late_ms = max(0, now_ms - fire_ms)
    details = {
        "fire_time_ms": fire_ms,
        "now_ms": now_ms,
        "late_ms": late_ms,
        "window_ms": window_ms,
    }
    if late_ms > window_ms:
        return Decision(MISSED, f"late by {late_ms} ms, window is {window_ms} ms", details)
    return Decision(SHOULD_RUN, "inside the trigger window", details)
