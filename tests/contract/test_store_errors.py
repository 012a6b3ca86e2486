"""How real driver errors of the server databases are translated: a deadlock or a lock
timeout rolled the transaction back, so callers must wait it out and send it again
(`StoreUnavailable`), never treat it as a refusal (`StoreError`) that ends a run for good."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskstream.core.errors import StoreRefused, StoreUnavailable
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_errors import translate
from taskstream.core.store.urls import normalize_url
from tests.support.databases import available_kinds, empty_database

_SERVERS = [kind for kind in available_kinds() if kind != "sqlite"]


@pytest.fixture(params=_SERVERS)
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[AsyncEngine]:
    """An engine on a fresh server database holding table `probe` with rows 1 and 2."""
    async with empty_database(request.param) as url:
        made = make_engine(normalize_url(url))
        try:
            async with made.begin() as conn:
                await conn.execute(text("CREATE TABLE probe (id INT PRIMARY KEY, v INT)"))
                await conn.execute(text("INSERT INTO probe (id, v) VALUES (1, 0), (2, 0)"))
            yield made
        finally:
            await made.dispose()


async def _update(conn: AsyncConnection, row: int) -> None:
    await conn.execute(text("UPDATE probe SET v = v + 1 WHERE id = :id"), {"id": row})


async def _short_lock_wait(conn: AsyncConnection) -> None:
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SET lock_timeout = '200ms'"))
    else:
        await conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))


async def test_a_deadlock_is_waited_out_not_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        await second.begin()
        await _update(first, 1)
        await _update(second, 2)
        outcomes = await asyncio.gather(
            _update(first, 2), _update(second, 1), return_exceptions=True
        )
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert len(errors) == 1, outcomes  # the server chose one victim
        translated = translate(errors[0], "db")
        assert isinstance(translated, StoreUnavailable), translated
        assert "deadlock" in str(translated).lower()


async def test_a_lock_wait_timeout_is_waited_out_not_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.begin()
        await _update(holder, 1)
        await _short_lock_wait(waiter)  # begins the waiter's transaction
        with pytest.raises(Exception) as caught:
            await _update(waiter, 1)
        translated = translate(caught.value, "db")
        assert isinstance(translated, StoreUnavailable), translated
        assert "lock" in str(translated).lower()


async def _short_statement_time(conn: AsyncConnection) -> None:
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SET statement_timeout = '200ms'"))
    else:
        await conn.execute(text("SET SESSION max_statement_time = 0.2"))


async def _cancel(conn: AsyncConnection, victim: int) -> None:
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_cancel_backend(:p)"), {"p": victim})
    else:
        await conn.execute(text(f"KILL QUERY {victim:d}"))


async def _session_id(conn: AsyncConnection) -> int:
    query = (
        "SELECT pg_backend_pid()"
        if conn.dialect.name == "postgresql"
        else "SELECT @@pseudo_thread_id"
    )
    return int((await conn.execute(text(query))).scalar_one())


_LOCK_WAITS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity"
    " WHERE pid = :p AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.processlist"
    " WHERE id = :p AND info LIKE 'UPDATE probe%'",
}


async def _until_waiting(conn: AsyncConnection, victim: int) -> None:
    """Poll (at most 10 s) until session `victim` waits on a row lock."""
    query = text(_LOCK_WAITS[conn.dialect.name])
    for _ in range(1000):
        async with conn.engine.connect() as look:  # a new snapshot of the activity views
            if (await look.execute(query, {"p": victim})).scalar_one():
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"session {victim} never waited on the lock")


async def test_a_statement_timeout_is_waited_out_not_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.begin()
        await _update(holder, 1)
        await _short_statement_time(waiter)
        with pytest.raises(Exception) as caught:
            await _update(waiter, 1)
    translated = translate(caught.value, "db")
    assert isinstance(translated, StoreUnavailable), translated


async def test_a_cancelled_statement_is_waited_out_not_refused(engine: AsyncEngine) -> None:
    """An operator's or a pooler's cancel (`pg_cancel_backend`, `KILL QUERY`) of a statement
    waiting on a row lock: nothing was written, so it passes."""
    async with engine.connect() as holder, engine.connect() as waiter:
        await holder.begin()
        await _update(holder, 1)
        victim = await _session_id(waiter)
        waiting = asyncio.ensure_future(_update(waiter, 1))
        await _until_waiting(holder, victim)
        await _cancel(holder, victim)
        with pytest.raises(Exception) as caught:
            await waiting
    translated = translate(caught.value, "db")
    assert isinstance(translated, StoreUnavailable), translated


async def test_a_value_too_long_for_its_column_is_refused(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("CREATE TABLE narrow (s VARCHAR(4))"))
        await conn.commit()
        with pytest.raises(Exception) as caught:
            await conn.execute(text("INSERT INTO narrow (s) VALUES (:s)"), {"s": "x" * 40})
    translated = translate(caught.value, "db")
    assert isinstance(translated, StoreRefused), translated
