"""A scheduler that starts deciding a task reads back every decision past its cursor, a page
at a time: however many there are, each comes once and in order, so no tick already decided
is decided a second time."""

from __future__ import annotations

import pytest

from taskstream.core.store.port import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler import emit
from taskstream.scheduler.emit import decisions_after


def _row(fire_ms: int, decision: str) -> DecisionRow:
    return DecisionRow("t", fire_ms, decision, "r", {}, None, fire_ms)


async def test_every_decision_past_the_cursor_is_read_once_in_order(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 4 rows over 9 fire times, two rows (a wait, then the final decision) each:
    page ends fall inside a fire time's rows, which are read again with the next page."""
    monkeypatch.setattr(emit, "RECALL_PAGE", 4)
    written = [
        _row(fire, decision)
        for fire in range(1_000, 10_000, 1_000)
        for decision in ("wait_dep", "should_run")
    ]
    written.insert(0, _row(500, "should_run"))  # at the cursor: not read
    for row in written:
        assert await store.record_decision(row)
    got = await decisions_after(store, "t", 500)
    assert [(r.fire_time_ms, r.decision) for r in got] == [
        (r.fire_time_ms, r.decision) for r in written[1:]
    ]


async def test_a_fire_time_with_more_rows_than_a_page_does_not_stop_the_reading(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emit, "RECALL_PAGE", 3)
    for decision in ("wait_dep", "wait_dep", "wait_dep", "wait_dep", "should_run"):
        assert await store.record_decision(_row(1_000, decision))
    assert await store.record_decision(_row(2_000, "should_run"))
    got = await decisions_after(store, "t", 0)
    assert [r.fire_time_ms for r in got][-1] == 2_000
