"""How real driver errors of the server databases are translated: a deadlock or a lock
timeout rolled the transaction back, so callers must wait it out and send it again
(`StoreUnavailable`), never treat it as a refusal (`StoreError`) that ends a run for good."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskstream.core.errors import StoreUnavailable
from taskstream.core.store.sql_engine import make_engine, translate
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
