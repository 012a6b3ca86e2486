"""Interleavings of concurrent writers, made to happen at one chosen point of a store call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.states import Status
from taskstream.core.store import sql_instances as rows
from taskstream.core.store.sql import SqlStore


@asynccontextmanager
async def dispatch_before_status_read(
    monkeypatch: pytest.MonkeyPatch, db_url: str
) -> AsyncIterator[list[Status | None]]:
    """Within the block, before the store's first read of a row's status after a missed CAS,
    the outbox's PENDING -> DISPATCHED of that row commits on another connection: the READ
    COMMITTED window between an UPDATE that missed and the status read. Yields the list that
    then holds the status that read found. Needs a database with concurrent writers (not
    SQLite)."""
    other = await SqlStore.connect(db_url)
    real = rows.status_of
    found: list[Status | None] = []

    async def outbox_commits_first(conn: AsyncConnection, instance_id: str) -> Status | None:
        if not found:
            moved = await other.transition(
                instance_id, Status.PENDING, Status.DISPATCHED, reason="published"
            )
            assert moved.ok
            found.append(await real(conn, instance_id))
            return found[-1]
        return await real(conn, instance_id)

    monkeypatch.setattr(rows, "status_of", outbox_commits_first)
    try:
        yield found
    finally:
        await other.close()
