"""Rebuilding decided and waiting ticks from the explain log."""

from __future__ import annotations

from typing import Any

from taskstream.core.store.port import DecisionRow
from taskstream.scheduler import verdict
from taskstream.scheduler.hold import HELD_BY
from taskstream.scheduler.recall import recall

T = 1_800_000_000_000


def row(fire_ms: int, decision: str, **details: Any) -> DecisionRow:
    return DecisionRow("t", fire_ms, decision, "why", details, None, T)


def test_the_latest_row_of_each_tick_counts() -> None:
    decided, waiting = recall(
        [
            row(T, verdict.WAIT_DEP, open_until_ms=T + 300_000),
            row(T, verdict.SHOULD_RUN),
            row(T + 60_000, verdict.SKIP_OVERLAP),
            row(T + 120_000, verdict.WAIT_DEP, open_until_ms=T + 420_000),
        ]
    )
    assert decided == {T, T + 60_000}
    assert list(waiting) == [T + 120_000]
    assert (waiting[T + 120_000].decision, waiting[T + 120_000].until_ms) == (
        verdict.WAIT_DEP,
        T + 420_000,
    )
    assert not waiting[T + 120_000].final


def test_waiting_ticks_are_decided_again_when_their_decision_said() -> None:
    _, waiting = recall(
        [
            row(T, verdict.DEFERRED, deferral={"until_ms": T + 5_000}, open_until_ms=T + 9_000),
            row(T + 1, verdict.DEFERRED, **{HELD_BY: {"llm": T + 7_000, "db": T + 6_000}}),
            row(T + 2, verdict.WAIT_DEP),
            row(
                T + 3,
                verdict.DEFERRED,
                calendar={"rule": "maintenance", "until_ms": T + 3_600_000},
                deferral=None,
                open_until_ms=T + 9_000,
            ),
        ]
    )
    assert {f: d.until_ms for f, d in waiting.items()} == {
        T: T + 5_000,
        T + 1: T + 6_000,
        T + 2: None,
        T + 3: T + 3_600_000,  # the end of the maintenance window, not the trigger window
    }


def test_an_operators_trigger_or_backfill_at_a_fire_time_does_not_decide_the_tick() -> None:
    decided, waiting = recall(
        [
            row(T, verdict.SHOULD_RUN, **{verdict.MANUAL: True}),
            row(T + 60_000, verdict.WAIT_DEP, open_until_ms=T + 360_000),
            row(T + 60_000, verdict.SKIP_DUPLICATED, **{verdict.BACKFILL: True}),
        ]
    )
    assert decided == set()
    assert list(waiting) == [T + 60_000]
    assert waiting[T + 60_000].decision == verdict.WAIT_DEP
