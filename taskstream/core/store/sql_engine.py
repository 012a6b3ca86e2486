"""Engines for the SQL store: per-dialect session setup.

Session setup, applied to every pooled connection:
- SQLite: WAL, `busy_timeout` 10 s, foreign keys on, and SQLAlchemy (not the driver) emits
  BEGIN: `BEGIN IMMEDIATE` for writes, so a writer takes the file's write lock when the
  transaction starts and waits up to `busy_timeout` for it, instead of failing with "database is
  locked" when a read lock cannot be upgraded. Several processes can then share one file.
  Read-only work (`READ_ONLY` execution option) uses a deferred BEGIN and never blocks writers.
- MySQL / MariaDB: READ COMMITTED, session time zone `+00:00` (see `dbclock`), and on
  MariaDB an idle transaction ended after `IDLE_TRANSACTION_S`.
  SQLAlchemy's asyncmy dialect sets the FOUND_ROWS client flag, so an UPDATE's rowcount counts
  matched rows, not changed rows.
- PostgreSQL: READ COMMITTED (the default), each statement bounded by `READ_TIMEOUT_S`,
  an idle transaction ended after `IDLE_TRANSACTION_S`.

A SQLite file that does not exist is made only by an engine made with `create` (migrations):
any other connect fails with `StoreFileMissing`, so a typo in the path leaves no empty file.

Driver errors are translated by `sql_errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from taskstream.core.errors import (
    ConfigError,
    StoreError,
)
from taskstream.core.store.sql_errors import ConstraintViolation, NoStoreFile
from taskstream.core.store.urls import asyncpg_numbers, redact_url

READ_ONLY = "taskstream_read_only"
"""Execution option: the transaction only reads (SQLite then uses a deferred BEGIN)."""

POOL_RECYCLE_S = 1800
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60.0
"""Longest wait for one reply of MySQL / MariaDB, or for one statement of PostgreSQL
(asyncpg's `command_timeout`, unless the URL sets one), on an open connection (s): longer
than InnoDB's own lock wait (50 s by default), which ends a statement waiting for a row
lock. PostgreSQL's lock waits have no end of their own; the idle transaction bound frees
the locks of a client that cannot go on."""
SQLITE_BUSY_TIMEOUT_MS = 10_000
IDLE_TRANSACTION_S = 10
"""Longest a transaction may stay open with no statement running (s) before the server (MariaDB
10.3+, PostgreSQL) ends the session and rolls it back: a client cut off between statements
(a partition, a frozen host) would otherwise hold its row locks until the server noticed the
connection was gone, hours later, and every write of those rows would wait for them. Ours
send their statements back to back, so only a client that cannot go on is ended."""

_SQLITE_PRAGMAS = (
    # busy_timeout first: switching to WAL needs a lock another process may hold.
    f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)


T = TypeVar("T")


CONFLICT_TRIES = 3
"""Tries of an upsert whose inserts a concurrent writer of the same keys beat."""


async def upsert_retrying(
    write: Callable[[], AbstractAsyncContextManager[AsyncConnection]],
    body: Callable[[AsyncConnection], Awaitable[T]],
    what: str,
) -> T:
    """`body` (read, then insert or update) in a write transaction, run again in a fresh one
    when a concurrent writer inserted one of its keys first: the next try reads that row and
    updates it. `StoreError` naming `what` after `CONFLICT_TRIES` conflicts."""
    last: ConstraintViolation | None = None
    for _ in range(CONFLICT_TRIES):
        try:
            async with write() as conn:
                return await body(conn)
        except ConstraintViolation as exc:
            last = exc
    raise StoreError(f"{what} kept conflicting: {last}") from last


POOL_SIZE = 10
"""Pooled connections per process (plus the default overflow of 10). No pre-ping: it costs a
round trip per transaction; a connection the server dropped fails its statement instead, the
pool discards it, and the caller's loop retries (`StoreUnavailable`). No reset on return:
every use ends its own transaction (`begin()` commits or rolls back; a read's `connect()`
rolls back on close), so the pool's extra ROLLBACK would be a wasted round trip."""


def make_engine(
    url: str,
    *,
    read_timeout_s: float | None = READ_TIMEOUT_S,
    idle_transaction_s: int | None = IDLE_TRANSACTION_S,
    create: bool = False,
) -> AsyncEngine:
    """An engine for a normalized (async-driver) URL, with the session setup above;
    `read_timeout_s` bounds each reply of MySQL / MariaDB and `idle_transaction_s` the idle
    time of an open transaction (None: no bound, for migrations, whose DDL may take minutes
    on large tables); `create` lets SQLite make a file that does not exist (for migrations
    only)."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, create=create)
    if backend == "mysql":
        return _mysql_engine(url, read_timeout_s, idle_transaction_s)
    if backend == "postgresql":
        return _postgres_engine(url, read_timeout_s, idle_transaction_s)
    raise ConfigError([f"no SQL store for database backend {backend!r}"])


def _postgres_engine(
    url: str, read_timeout_s: float | None, idle_transaction_s: int | None
) -> AsyncEngine:
    """The engine of a PostgreSQL store. Each statement is bounded by `read_timeout_s`, as a
    MariaDB reply is: without it, a server that stops answering on an open connection
    (frozen, or cut off without a reset) hangs its caller until TCP gives up, many minutes
    later (asyncpg then cancels the statement, and the store is unavailable)."""
    try:
        numbers: dict[str, float] = asyncpg_numbers(url)
    except ValueError as exc:
        raise ConfigError([f"invalid database URL {redact_url(url)}: {exc}"]) from None
    if read_timeout_s is not None:
        numbers.setdefault("command_timeout", read_timeout_s)
    engine = create_async_engine(
        url,
        pool_recycle=POOL_RECYCLE_S,
        pool_size=POOL_SIZE,
        pool_reset_on_return=None,
        connect_args={"timeout": CONNECT_TIMEOUT_S, **numbers},
    )
    if idle_transaction_s is not None:
        event.listen(engine.sync_engine, "connect", _postgres_session(idle_transaction_s))
    return engine


def _postgres_session(
    idle_transaction_s: int,
) -> Callable[[DBAPIConnection, ConnectionPoolEntry], None]:
    """The idle bound, set by a statement on each new connection, outside any transaction: as
    a startup parameter (asyncpg's `server_settings`) PgBouncer would refuse the connection."""
    setup = f"SET idle_in_transaction_session_timeout = {int(idle_transaction_s) * 1000}"

    def on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        dbapi_connection.run_async(lambda driver: driver.execute(setup))

    return on_connect


def _sqlite_engine(url: str, *, create: bool) -> AsyncEngine:
    engine = create_async_engine(url, pool_recycle=POOL_RECYCLE_S)
    if create:
        event.listen(engine.sync_engine, "do_connect", _sqlite_file_private)
    else:
        event.listen(engine.sync_engine, "do_connect", _sqlite_file_must_exist)
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_file_must_exist(
    _dialect: Any, _record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
) -> None:
    # Checked at each connect, not once: a role started before `migrate` waits for the file.
    path = _file_of(cargs, cparams)
    if path is not None and not os.path.exists(path):
        raise NoStoreFile(path)


def _sqlite_file_private(
    _dialect: Any, _record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
) -> None:
    # A store file made here is its owner's alone (0600; SQLite gives its -wal and -shm files
    # the same mode): it holds every payload and result. One that exists keeps its mode. What
    # fails here (no such folder) is left to SQLite's own connect to report.
    path = _file_of(cargs, cparams)
    if path is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _file_of(cargs: list[Any], cparams: dict[str, Any]) -> str | None:
    """The file a SQLite connect opens; None for an in-memory database and for a `file:` URI
    (uri=true), which says itself whether SQLite may make the file (its mode=)."""
    path = str(cargs[0])
    return None if cparams.get("uri") or path == ":memory:" else path


def _sqlite_on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    # The driver must not emit its own BEGIN; `_sqlite_on_begin` does.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    read_only = bool(connection.get_execution_options().get(READ_ONLY, False))
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _mysql_engine(
    url: str, read_timeout_s: float | None, idle_transaction_s: int | None
) -> AsyncEngine:
    engine = create_async_engine(
        url,
        isolation_level="READ COMMITTED",
        pool_recycle=POOL_RECYCLE_S,
        pool_size=POOL_SIZE,
        pool_reset_on_return=None,
        async_creator=_bounded_connect(url, read_timeout_s),
    )
    event.listen(engine.sync_engine, "connect", _mysql_session(idle_transaction_s))
    # An executemany INSERT (rows as parameters, times as SQL) goes out as multi-row INSERT
    # statements rendered from one cached compile. Without this, the driver's executemany
    # sends a statement per row, since its rewrite only handles plain placeholders.
    engine.sync_engine.dialect.use_insertmanyvalues_wo_returning = True
    return engine


def _bounded_connect(url: str, read_timeout_s: float | None) -> Callable[[], Awaitable[Any]]:
    """The driver's connect for `url`, bounded as a whole by `CONNECT_TIMEOUT_S`. The driver's
    own `connect_timeout` covers only the TCP connect: a server that accepts and never
    answers the handshake (frozen, or another service on a wrong port) would hang every
    caller for ever instead of making the store unavailable. With asyncmy, every reply is
    awaited at most `read_timeout_s`: a server that stops answering on an open connection
    (frozen, or cut off without a reset) then makes the store unavailable too, instead of
    hanging its caller until TCP gives up hours later."""
    parsed = make_url(url)
    cargs, cparams = parsed.get_dialect()().create_connect_args(parsed)
    cparams["connect_timeout"] = CONNECT_TIMEOUT_S
    if read_timeout_s is not None and parsed.get_driver_name() == "asyncmy":
        cparams["read_timeout"] = read_timeout_s
    driver: Any = importlib.import_module(parsed.get_driver_name())  # asyncmy or aiomysql

    async def connect() -> Any:
        try:
            return await asyncio.wait_for(driver.connect(*cargs, **cparams), CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"no answer to the handshake within {CONNECT_TIMEOUT_S} s") from None

    return connect


def _mysql_session(
    idle_transaction_s: int | None,
) -> Callable[[DBAPIConnection, ConnectionPoolEntry], None]:
    """The session setup of each new connection. The idle bound is in a comment only MariaDB
    10.3 and later execute (`/*M!100300 ...*/`): MySQL has no such setting and reads a
    comment."""
    setup = "SET time_zone = '+00:00'"
    if idle_transaction_s is not None:
        setup += f"/*M!100300 , idle_transaction_timeout = {int(idle_transaction_s)}*/"

    def on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(setup)
        finally:
            cursor.close()

    return on_connect
