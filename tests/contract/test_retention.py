"""The pruning SQL that docs/operations.md ("Retention") gives operators, run as written on
every database kind: it deletes settled instances older than the cutoff with their history,
side-effect keys, alerts and review entries, and old decisions and markers; it keeps every
in-flight instance and everything newer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, text, update

from taskstream.core.states import Status
from taskstream.core.store.records import DecisionRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import (
    alerts,
    instance_history,
    readiness_markers,
    review_queue,
    side_effects,
    task_instances,
    trigger_decisions,
)
from tests.contract.conftest import Advance, MakeNew

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
DAY_MS = 86_400_000
OLD_MS = 1_000_000_000_000


def documented_sql() -> list[str]:
    """The statements of the block after `<!-- retention:sql -->`."""
    found = re.search(r"<!-- retention:sql -->\n```sql\n(.*?)```", DOC.read_text(), re.S)
    assert found, "docs/operations.md has no retention SQL block"
    return [s.strip() for s in found.group(1).split(";") if s.strip()]


async def _instance(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str, status: Status, *, old: bool
) -> str:
    new = make_new(name)
    await store.create_instance(new)
    await advance(new.id, status)
    async with store.engine.begin() as conn:
        await conn.execute(
            insert(side_effects).values(
                idempotency_key=f"{new.dedupe_key}:mail",
                instance_id=new.id,
                attempt=1,
                created_at_ms=OLD_MS,
            )
        )
        await conn.execute(
            insert(alerts).values(
                instance_id=new.id, level="urgent", message="m", created_at_ms=OLD_MS
            )
        )
        if old:
            await conn.execute(
                update(task_instances)
                .where(task_instances.c.id == new.id)
                .values(updated_at_ms=OLD_MS)
            )
    await store.add_review(new.id, "check")
    return new.id


async def _ids(store: SqlStore, column: ColumnElement[Any]) -> set[object]:
    async with store.engine.connect() as conn:
        return set((await conn.execute(select(column).distinct())).scalars())


async def test_the_documented_pruning_keeps_in_flight_and_recent_rows(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    gone = {
        await _instance(store, make_new, advance, n, s, old=True)
        for n, s in (
            ("old-ok", Status.SUCCESS),
            ("old-failed", Status.FAILED),
            ("old-skipped", Status.SKIPPED),
        )
    }
    kept = {
        await _instance(store, make_new, advance, n, s, old=old)
        for n, s, old in (
            ("old-retrying", Status.RETRYING, True),
            ("old-running", Status.RUNNING, True),
            ("new-ok", Status.SUCCESS, False),
        )
    }
    for at_ms in (OLD_MS, await store.db_now_ms()):
        await store.record_decision(
            DecisionRow("report", at_ms, "should_run", "due", {}, None, at_ms)
        )
    await store.mark_ready("old.ready", "2001-09-09")
    await store.mark_ready("new.ready", "2026-12-01")
    async with store.engine.begin() as conn:
        await conn.execute(
            update(readiness_markers)
            .where(readiness_markers.c.name == "old.ready")
            .values(created_at_ms=OLD_MS)
        )

    cutoff_ms = await store.db_now_ms() - DAY_MS
    async with store.engine.begin() as conn:
        for statement in documented_sql():
            await conn.execute(text(statement), {"cutoff_ms": cutoff_ms})

    assert await _ids(store, task_instances.c.id) == kept
    for column in (
        instance_history.c.instance_id,
        side_effects.c.instance_id,
        alerts.c.instance_id,
        review_queue.c.instance_id,
    ):
        assert await _ids(store, column) == kept, column
    assert await _ids(store, readiness_markers.c.name) == {"new.ready"}
    async with store.engine.connect() as conn:
        left = await conn.execute(select(func.min(trigger_decisions.c.decided_at_ms)))
        assert left.scalar_one() >= cutoff_ms
    assert not gone & kept
