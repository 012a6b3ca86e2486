"""A write the database rolls back for a conflict with another transaction (a deadlock, a
row lock waited for past the lock wait timeout) is made again by the store at once, in a new
transaction whose compare-and-sets meet the rows as the other left them, instead of failing
with the store "unavailable", which the executor and the sweeper wait out for seconds and the
committer writes again only after a pause."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskstream.core.errors import StoreUnavailable
from taskstream.core.states import Status
from taskstream.core.store.port import ClaimRequest, DispatchRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.urls import normalize_url
from tests.contract.store_batch_cases import _seed
from tests.support.databases import available_kinds, temp_database

_SERVERS = [kind for kind in available_kinds() if kind != "sqlite"]
_DONE_S = 30.0
"""Bound on each operation: far above a conflict's own wait (lock waits of 1 s)."""


def _short_lock_wait(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        if type(dbapi_connection).__module__.startswith("sqlalchemy.dialects.postgresql"):
            cursor.execute("SET lock_timeout = '300ms'")
        else:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
    finally:
        cursor.close()


@pytest.fixture(params=_SERVERS)
async def urls(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async with temp_database(request.param) as url:
        yield url


@pytest.fixture
async def store(urls: str) -> AsyncIterator[SqlStore]:
    """A store whose connections wait at most about a second for a row lock."""
    opened = await SqlStore.connect(urls, check=False)
    event.listen(opened.engine.sync_engine, "connect", _short_lock_wait)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def other(urls: str) -> AsyncIterator[AsyncEngine]:
    """An engine for another writer of the same database."""
    made = make_engine(normalize_url(urls))
    try:
        yield made
    finally:
        await made.dispose()


def _on_repeat(store: SqlStore) -> asyncio.Event:
    """Set when the store sends a statement it has sent before since this call: the
    transaction that met the conflict is being made again."""
    seen: set[str] = set()
    repeated = asyncio.Event()
    loop = asyncio.get_running_loop()

    def keep(statement: str) -> None:
        if statement in seen:
            loop.call_soon_threadsafe(repeated.set)
        seen.add(statement)

    def record(_conn: Connection, _cursor: Any, statement: str, *_rest: Any) -> None:
        keep(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    store.statement_listeners.append(keep)
    return repeated


async def _lock(conn: AsyncConnection, ids: list[str]) -> None:
    """Take the row locks of `ids` on `conn`'s open transaction (and write them)."""
    update = text("UPDATE task_instances SET updated_at_ms = updated_at_ms + 1 WHERE id = :id")
    await conn.execute(update, [{"id": i} for i in ids])


async def _held_until_repeat(
    store: SqlStore, other: AsyncEngine, locked: str, write: Callable[[], Awaitable[Any]]
) -> Any:
    """`write()` while `other` holds the row lock of `locked`, released only once the store
    made its transaction again after the lock wait timed out."""
    async with other.connect() as holder:
        await holder.begin()
        await _lock(holder, [locked])
        repeated = _on_repeat(store)
        writing = asyncio.ensure_future(asyncio.wait_for(write(), _DONE_S))
        waiting = asyncio.ensure_future(repeated.wait())
        await asyncio.wait({writing, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        await holder.commit()
    return await writing


async def test_a_claim_batch_meeting_a_lock_wait_timeout_is_made_again(
    store: SqlStore, other: AsyncEngine
) -> None:
    [a, b] = await _seed(store, ["a", "b"])
    claimed = await _held_until_repeat(
        store,
        other,
        b,
        lambda: store.claim_many(
            [ClaimRequest(a, 0, 30.0), ClaimRequest(b, 0, 30.0)], owner="exec-1"
        ),
    )
    assert {i: c.token for i, c in claimed.items()} == {a: 1, b: 1}
    history = [h.reason for h in await store.history(b)]
    assert history == ["claimed"]  # one move: the first try wrote nothing


async def test_a_finish_batch_meeting_a_lock_wait_timeout_is_made_again(
    store: SqlStore, other: AsyncEngine
) -> None:
    [a] = await _seed(store, ["a"], status=Status.RUNNING, attempt=1, owner="exec-1")
    done = FinishRequest(a, 1, Status.SUCCESS, "succeeded", owner="exec-1")
    results = await _held_until_repeat(store, other, a, lambda: store.finish_many([done]))
    assert results[a].ok
    row = await store.get_instance(a)
    assert row is not None and row.status is Status.SUCCESS


async def test_a_lease_batch_meeting_a_lock_wait_timeout_is_made_again(
    store: SqlStore, other: AsyncEngine
) -> None:
    [a] = await _seed(store, ["a"], status=Status.RUNNING, attempt=1, owner="exec-1")
    held = await _held_until_repeat(
        store, other, a, lambda: store.extend_leases([(a, 1)], lease_s=30.0)
    )
    assert held == {(a, 1)}


async def test_a_dispatch_batch_meeting_a_lock_wait_timeout_is_made_again(
    store: SqlStore, other: AsyncEngine
) -> None:
    [a] = await _seed(store, ["a"], status=Status.PENDING)
    results = await _held_until_repeat(
        store, other, a, lambda: store.dispatch_many([DispatchRequest(a, Status.PENDING, 0)])
    )
    assert results[a].ok


async def _until_waiting(other: AsyncEngine) -> None:
    """Poll (at most 10 s) until some session of this database waits for a row lock."""
    if other.dialect.name == "postgresql":
        query = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    else:
        query = (
            "SELECT count(*) FROM information_schema.innodb_trx t"
            " JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id"
            " WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
        )
    for _ in range(1000):
        async with other.connect() as look:
            if (await look.execute(text(query))).scalar_one():
                return
        await asyncio.sleep(0.01)
    raise AssertionError("the claim never waited for the row lock")


async def test_a_claim_batch_chosen_as_a_deadlock_victim_is_made_again(
    store: SqlStore, other: AsyncEngine
) -> None:
    """The claim locks a, then waits for b, which another writer holds along with more rows
    (so the claim is the lighter transaction, the one rolled back); that writer then asks
    for a: a deadlock."""
    [a, b, *extra] = await _seed(store, ["a", "b", "c", "d", "e", "f"])
    async with other.connect() as holder:
        await holder.begin()
        await _lock(holder, [b, *extra])
        claiming = asyncio.ensure_future(
            asyncio.wait_for(
                store.claim_many(
                    [ClaimRequest(a, 0, 30.0), ClaimRequest(b, 0, 30.0)], owner="exec-1"
                ),
                _DONE_S,
            )
        )
        await _until_waiting(other)
        await holder.execute(
            text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE"), {"id": a}
        )
        await holder.commit()
        claimed = await claiming
    assert {i: c.token for i, c in claimed.items()} == {a: 1, b: 1}
    assert [h.reason for h in await store.history(a)] == ["claimed"]


def _short_busy_wait(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout = 200")
    finally:
        cursor.close()


async def test_a_sqlite_file_locked_past_the_busy_timeout_is_an_outage() -> None:
    """Another process holding the file's write lock longer than the busy timeout: the
    write fails as the store unavailable (the roles wait it out), not as a refusal or a
    driver error that would end them, and leaves nothing written."""
    async with temp_database("sqlite") as url:
        store = await SqlStore.connect(url, check=False)
        event.listen(store.engine.sync_engine, "connect", _short_busy_wait)
        other = make_engine(normalize_url(url))
        try:
            [a] = await _seed(store, ["a"])
            async with other.connect() as holder:
                await holder.execute(text("SELECT 1"))  # BEGIN IMMEDIATE: the write lock
                with pytest.raises(StoreUnavailable, match="locked"):
                    await store.claim_many([ClaimRequest(a, 0, 30.0)], owner="exec-1")
                await holder.rollback()
            claimed = await store.claim_many([ClaimRequest(a, 0, 30.0)], owner="exec-1")
            assert {i: c.token for i, c in claimed.items()} == {a: 1}
        finally:
            await other.dispose()
            await store.close()
