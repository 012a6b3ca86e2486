"""A client cut off from the database in the middle of a transaction (a network partition, a
frozen host: no reset reaches the server) does not hold its row locks for longer than the idle
transaction bound: the server ends its session, and the rows it had locked are written by
others, on MariaDB and PostgreSQL. The partition is a forwarder that stops relaying."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from taskstream.core.errors import StoreUnavailable
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_errors import translate_errors
from taskstream.core.store.urls import normalize_url
from tests.contract.conftest import Advance, MakeNew
from tests.support.forwarder import Forwarder

IDLE_S = 1
READ_S = 1.0
BOUND_S = 10.0
"""Far below MariaDB's lock wait (50 s) and PostgreSQL's (none): only the fix frees the row."""


async def test_a_transaction_cut_off_mid_way_does_not_hold_its_row_locks(
    db_url: str, store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("one SQLite file has no network between its clients")
    await store.create_instance(make_new("locked"))
    url = make_url(normalize_url(db_url))
    async with Forwarder([("127.0.0.1", 0)], (url.host or "127.0.0.1", url.port or 0)) as fwd:
        via = url.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
        engine = make_engine(via, idle_transaction_s=IDLE_S)
        conn = await engine.connect()
        try:
            await conn.begin()
            locked = text("SELECT id FROM task_instances WHERE id = :id FOR UPDATE")
            await conn.execute(locked, {"id": "inst-locked"})
            fwd.blackhole()

            started = time.monotonic()
            async with asyncio.timeout(BOUND_S):
                await advance("inst-locked", Status.DISPATCHED)
            assert time.monotonic() - started < BOUND_S

            fwd.restore()
            with pytest.raises(StoreUnavailable):  # the cut-off session was ended
                async with translate_errors("db"):
                    await conn.execute(text("SELECT 1"))
        finally:
            fwd.restore()
            with contextlib.suppress(Exception):
                await conn.close()
            await engine.dispose()
    row = await store.get_instance("inst-locked")
    assert row is not None and row.status is Status.DISPATCHED


async def test_a_store_that_stops_answering_an_open_connection_is_unavailable_in_time(
    db_url: str,
) -> None:
    """A statement on a connection that gets no reply (the server frozen, or cut off without
    a reset) ends within the read timeout as the store unavailable, on PostgreSQL as on
    MariaDB, instead of hanging until TCP gives up; once the link is back the store answers
    on the same engine."""
    if db_url.startswith("sqlite"):
        pytest.skip("one SQLite file has no network between its clients")
    url = make_url(normalize_url(db_url))
    async with Forwarder([("127.0.0.1", 0)], (url.host or "127.0.0.1", url.port or 0)) as fwd:
        via = url.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
        engine = make_engine(via, read_timeout_s=READ_S)
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            fwd.blackhole()
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                async with asyncio.timeout(BOUND_S), translate_errors("db"), engine.connect() as c:
                    await c.execute(text("SELECT 1"))
            assert time.monotonic() - started < BOUND_S
            fwd.restore()
            async with translate_errors("db"), engine.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        finally:
            fwd.restore()
            await engine.dispose()
