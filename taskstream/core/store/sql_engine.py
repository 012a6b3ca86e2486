"""Engines for the SQL store: per-dialect session setup and driver-error translation.

Session setup, applied to every pooled connection:
- SQLite: WAL, `busy_timeout` 10 s, foreign keys on, and SQLAlchemy (not the driver) emits
  BEGIN: `BEGIN IMMEDIATE` for writes, so a writer takes the file's write lock when the
  transaction starts and waits up to `busy_timeout` for it, instead of failing with "database is
  locked" when a read lock cannot be upgraded. Several processes can then share one file.
  Read-only work (`READ_ONLY` execution option) uses a deferred BEGIN and never blocks writers.
- MySQL / MariaDB: READ COMMITTED, session time zone `+00:00` (see `dbclock`), pre-ping.
  SQLAlchemy's asyncmy dialect sets the FOUND_ROWS client flag, so an UPDATE's rowcount counts
  matched rows, not changed rows.
- PostgreSQL: READ COMMITTED (the default), pre-ping.

A SQLite file that does not exist is made only by an engine made with `create` (migrations):
any other connect fails with `StoreFileMissing`, so a typo in the path leaves no empty file.

Driver errors never leave this package: `translate_errors` turns them into `StoreConflict`
(a deadlock or a lock timeout rolled the transaction back: `sql_conflicts` sends it again),
`StoreUnavailable` (cannot reach / lost the connection: nothing was written, retry later),
`ConstraintViolation` (an integrity constraint, handled by the adapter) or `StoreError`.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from taskstream.core.errors import (
    ConfigError,
    SchemaMissing,
    StoreConflict,
    StoreError,
    StoreFileMissing,
    StoreRefused,
    StoreUnavailable,
)
from taskstream.core.store.sql_conflicts import is_conflict, is_lock_wait
from taskstream.core.store.urls import asyncpg_numbers, redact_url

READ_ONLY = "taskstream_read_only"
"""Execution option: the transaction only reads (SQLite then uses a deferred BEGIN)."""

POOL_RECYCLE_S = 1800
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60.0
"""Longest wait for one reply of MySQL / MariaDB on an open connection (s): longer than
InnoDB's own lock wait (50 s by default), which ends a statement waiting for a row lock."""
SQLITE_BUSY_TIMEOUT_MS = 10_000
_DETAIL_MAX = 300

_SQLITE_PRAGMAS = (
    # busy_timeout first: switching to WAL needs a lock another process may hold.
    f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)


T = TypeVar("T")


class ConstraintViolation(StoreError):
    """An integrity constraint (UNIQUE, primary key, NOT NULL, foreign key) rejected a write
    and the transaction was rolled back. Callers expecting a duplicate confirm it by reading."""


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
    url: str, *, read_timeout_s: float | None = READ_TIMEOUT_S, create: bool = False
) -> AsyncEngine:
    """An engine for a normalized (async-driver) URL, with the session setup above;
    `read_timeout_s` bounds each reply of MySQL / MariaDB (None: no bound, for migrations,
    whose DDL may take minutes on large tables); `create` lets SQLite make a file that does
    not exist (for migrations only)."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, create=create)
    if backend == "mysql":
        return _mysql_engine(url, read_timeout_s)
    if backend == "postgresql":
        try:
            numbers = asyncpg_numbers(url)
        except ValueError as exc:
            raise ConfigError([f"invalid database URL {redact_url(url)}: {exc}"]) from None
        return create_async_engine(
            url,
            pool_recycle=POOL_RECYCLE_S,
            pool_size=POOL_SIZE,
            pool_reset_on_return=None,
            connect_args={"timeout": CONNECT_TIMEOUT_S, **numbers},
        )
    raise ConfigError([f"no SQL store for database backend {backend!r}"])


class _NoStoreFile(Exception):
    """A SQLite connect found no file at `path`; `translate_errors` names the store."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _sqlite_engine(url: str, *, create: bool) -> AsyncEngine:
    engine = create_async_engine(url, pool_recycle=POOL_RECYCLE_S)
    if not create:
        event.listen(engine.sync_engine, "do_connect", _sqlite_file_must_exist)
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_file_must_exist(
    _dialect: Any, _record: ConnectionPoolEntry, cargs: list[Any], cparams: dict[str, Any]
) -> None:
    # Checked at each connect, not once: a role started before `migrate` waits for the file.
    # A `file:` URI (uri=true) says itself whether SQLite may make the file (its mode=).
    path = str(cargs[0])
    if not cparams.get("uri") and path != ":memory:" and not os.path.exists(path):
        raise _NoStoreFile(path)


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


def _mysql_engine(url: str, read_timeout_s: float | None) -> AsyncEngine:
    engine = create_async_engine(
        url,
        isolation_level="READ COMMITTED",
        pool_recycle=POOL_RECYCLE_S,
        pool_size=POOL_SIZE,
        pool_reset_on_return=None,
        async_creator=_bounded_connect(url, read_timeout_s),
    )
    event.listen(engine.sync_engine, "connect", _mysql_on_connect)
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


def _mysql_on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET time_zone = '+00:00'")
    finally:
        cursor.close()


def _detail(exc: BaseException) -> str:
    cause: Any = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    text = f"{type(cause).__name__}: {cause}".replace("\n", " ")
    return text[:_DETAIL_MAX]


_PASSING_SQLSTATES = frozenset({"25006", "40001", "40P01", "55P03"})
_PASSING_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "58"})
"""PostgreSQL errors that pass: read-only during a failover, serialization failure, deadlock,
lock timeout; and the classes connection exception, insufficient resources, operator
intervention (a cancelled statement, a statement timeout, a shutdown) and system error.
Nothing was written, and sending it again can succeed. asyncpg reports them as generic errors;
MySQL's equivalents (deadlock 1213, lock wait 1205, statement time 1969, read-only 1290) are
already `OperationalError`s."""


def _sqlstate(exc: Exception) -> str:
    """PostgreSQL's SQLSTATE of a driver error ("" when it has none)."""
    return str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "")


def _is_unavailable(exc: Exception) -> bool:
    if isinstance(
        exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError | OSError
    ):
        return True
    state = _sqlstate(exc)
    if state in _PASSING_SQLSTATES or state[:2] in _PASSING_SQLSTATE_CLASSES:
        return True
    # Outside any statement means while connecting (e.g. PostgreSQL's unknown database or
    # role, which asyncpg reports as a generic error) or while committing on a lost link.
    return isinstance(exc, sa_exc.DBAPIError) and (
        exc.connection_invalidated or exc.statement is None
    )


_NO_TABLE = re.compile(
    r"no such table|\(1146,|Table '[^']*' doesn't exist|relation \"[^\"]*\" does not exist"
)
"""How SQLite, MySQL / MariaDB (error 1146) and PostgreSQL say a table does not exist."""
_NO_COLUMN = re.compile(
    r"no such column|has no column named|\(1054,"
    r"|column \"?[\w.]+\"?( of relation \"[^\"]*\")? does not exist"
)
"""How they say a column does not exist: a database migrated by an older taskstream."""


_TOO_LARGE = re.compile(r"\(1153,")
"""MySQL / MariaDB error 1153 (ER_NET_PACKET_TOO_LARGE): a statement over the server's
`max_allowed_packet`. The same statement sent again is refused again."""


def refused(detail: str, display_url: str) -> StoreError | None:
    """The error for a refusal that trying again cannot mend, from a driver error's text:
    `SchemaMissing`, or `StoreRefused` (not `StoreUnavailable`, which callers wait out and
    retry) for a statement over the server's packet limit; None for any other error."""
    if _TOO_LARGE.search(detail) is not None:
        return StoreRefused(
            f"store {display_url} refused a statement over its packet limit ({detail})"
        )
    return schema_missing(detail, display_url)


def schema_missing(detail: str, display_url: str) -> SchemaMissing | None:
    """`SchemaMissing` when a driver error's text says a table or a column does not exist:
    the database was never migrated, or was migrated by an older taskstream."""
    if _NO_TABLE.search(detail) is not None:
        what = "has no taskstream tables"
    elif _NO_COLUMN.search(detail) is not None:
        what = "is at an older schema than this taskstream's"
    else:
        return None
    return SchemaMissing(f"store {display_url} {what} ({detail}): run `taskstream migrate`")


def _driver_errors(exc: Exception) -> Iterator[Exception]:
    """`exc`, then the driver errors it was raised while handling, newest first: MariaDB
    closes the connection after refusing a statement over its packet limit, so the rollback
    that follows fails too ("server has gone away"), and only the first error says why."""
    yield exc
    found: BaseException | None = exc
    while isinstance(found, sa_exc.DBAPIError) and found.orig is not None:
        found = found.orig.__context__
        if isinstance(found, sa_exc.DBAPIError):
            yield found


def translate(exc: Exception, display_url: str) -> StoreError:
    """The domain error for a driver error raised while using the store at `display_url`
    (a redacted URL: only that form may appear in the message)."""
    if isinstance(exc, sa_exc.IntegrityError):
        return ConstraintViolation(f"store {display_url}: constraint violated: {_detail(exc)}")
    for error in _driver_errors(exc):
        final = refused(_detail(error), display_url)
        if final is not None:
            return final
    if is_conflict(exc):
        return StoreConflict(
            f"store {display_url} rolled back a conflict: {_detail(exc)}",
            lock_wait=is_lock_wait(exc),
        )
    if _is_unavailable(exc):
        return StoreUnavailable(f"store {display_url} unavailable: {_detail(exc)}")
    if isinstance(exc, sa_exc.DataError) or _sqlstate(exc).startswith("22"):
        # A value the column or encoding cannot hold (PostgreSQL's class 22, data exception).
        return StoreRefused(f"store {display_url} refused a value: {_detail(exc)}")
    return StoreError(f"store {display_url} failed: {_detail(exc)}")


@asynccontextmanager
async def translate_errors(display_url: str) -> AsyncIterator[None]:
    """Re-raise driver errors (SQLAlchemy, DBAPI, socket) from the body as store errors, a
    SQLite file that is not there as `StoreFileMissing`, and text a driver cannot encode (a
    lone surrogate, which SQLite's driver raises on) as `StoreRefused`, as PostgreSQL's
    server refuses it."""
    try:
        yield
    except (sa_exc.SQLAlchemyError, OSError) as exc:
        raise translate(exc, display_url) from exc
    except _NoStoreFile as exc:
        raise StoreFileMissing(
            f"store {display_url}: no file {exc.path} (a typo in the URL?): "
            "run `taskstream migrate` to make it"
        ) from None
    except UnicodeEncodeError as exc:
        raise StoreRefused(f"store {display_url} refused a value: {_detail(exc)}") from exc
