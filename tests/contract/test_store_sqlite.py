"""SQLite locking: writers take the write lock at BEGIN (IMMEDIATE) and wait for it up to
`busy_timeout`; readers use a deferred BEGIN and are not blocked by a writer (WAL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import event, update
from sqlalchemy.engine import Connection

from taskstream.core.store.port import DefinitionRecord
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import task_definitions
from tests.support.databases import temp_database


@pytest.fixture
async def sqlite_url() -> AsyncIterator[str]:
    async with temp_database("sqlite") as url:
        yield url


def _record(task_id: str) -> DefinitionRecord:
    return DefinitionRecord(task_id=task_id, spec={"id": task_id}, spec_hash=task_id)


async def test_reads_and_writes_around_an_open_write_transaction(sqlite_url: str) -> None:
    holder = await SqlStore.connect(sqlite_url)
    other = await SqlStore.connect(sqlite_url)
    begins: list[str] = []
    writer_began = asyncio.Event()

    def on_execute(conn: Connection, cursor: object, statement: str, *rest: object) -> None:
        if statement.startswith("BEGIN"):
            begins.append(statement)
        if statement == "BEGIN IMMEDIATE":
            writer_began.set()

    event.listen(other.engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        await holder.upsert_definitions([_record("a")])
        async with holder.engine.begin() as conn:
            await conn.execute(update(task_definitions).values(paused=True))
            # A reader does not wait for the writer and sees the last committed state.
            assert [d.paused for d in await other.list_definitions()] == [False]
            # A second writer waits for the lock instead of failing with "database is locked".
            writer = asyncio.create_task(other.upsert_definitions([_record("b")]))
            await writer_began.wait()
            assert not writer.done()
        assert await writer == {"b": "created"}
    finally:
        await holder.close()
        await other.close()

    assert begins == ["BEGIN", "BEGIN IMMEDIATE"]
    assert [d.paused for d in await _definitions(sqlite_url)] == [True, False]


async def _definitions(url: str) -> list[DefinitionRecord]:
    store = await SqlStore.connect(url)
    try:
        return await store.list_definitions()
    finally:
        await store.close()
