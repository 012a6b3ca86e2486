"""A write transaction straight on the MySQL / MariaDB driver, for the hot path's templates.

`driver_transaction` checks a connection out of the engine's pool (so pool size, recycling
and the session setup of `sql_engine` still apply), yields a `DriverRunner` over the driver's
cursor, commits when the body returns and rolls back when it raises. The connection goes back
to the pool, or is discarded when it may be broken: a lost link, a timeout, a cancellation in
the middle of a statement, or a rollback that failed.

Driver errors become store errors as `sql_errors.translate` makes them for the engine:
integrity errors `ConstraintViolation`, deadlocks and lock wait timeouts `StoreConflict`
(the connection is rolled back and kept), other operational and interface errors (lost
connection, server gone) and socket errors `StoreUnavailable`, a missing privilege
`StoreDenied`, a statement over the server's packet limit and anything else `StoreError`.
Errors the body raises itself (`RowsMoved`, `StoreError`) pass unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from taskstream.core.errors import StoreError, StoreRefused, StoreUnavailable
from taskstream.core.store.sql_conflicts import conflict_error, is_conflict
from taskstream.core.store.sql_errors import ConstraintViolation, refused, translate_errors
from taskstream.core.store.sql_prepared import DriverRunner

_DETAIL_MAX = 300


def driver_enabled(engine: AsyncEngine) -> bool:
    """The engine's driver can run templates directly: MySQL / MariaDB over asyncmy."""
    dialect = engine.dialect
    return dialect.name in ("mysql", "mariadb") and dialect.driver == "asyncmy"


def _detail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:_DETAIL_MAX]


def translate_driver(exc: BaseException, dbapi: Any, display_url: str) -> StoreError | None:
    """The store error for a driver error, or None when `exc` is not one."""
    if isinstance(exc, dbapi.IntegrityError):
        return ConstraintViolation(f"store {display_url}: constraint violated: {_detail(exc)}")
    final = _settled(exc, dbapi, display_url)
    if final is not None:
        return final
    if isinstance(exc, dbapi.OperationalError | dbapi.InterfaceError | OSError | TimeoutError):
        return StoreUnavailable(f"store {display_url} unavailable: {_detail(exc)}")
    if isinstance(exc, dbapi.DataError):
        return StoreRefused(f"store {display_url} refused a value: {_detail(exc)}")
    if isinstance(exc, dbapi.Error):
        return StoreError(f"store {display_url} failed: {_detail(exc)}")
    return None


def _settled(exc: BaseException, dbapi: Any, display_url: str) -> StoreError | None:
    """For a server's error reply: a conflict it rolled back (`StoreConflict`), a refusal
    trying again cannot mend (`refused`); else None."""
    if not isinstance(exc, dbapi.Error):
        return None
    conflict = conflict_error(exc, display_url, _detail(exc))
    if conflict is not None:
        return conflict
    return refused(_detail(exc), display_url)


def _link_may_be_broken(exc: BaseException, dbapi: Any) -> bool:
    """After `exc`, the connection may hold a half-read reply or no link at all. A server
    error reply (a constraint, a bad value, a deadlock, a lock wait that ran out) or our own
    `StoreError` leaves it clean."""
    if isinstance(exc, StoreError) or (isinstance(exc, dbapi.Error) and is_conflict(exc)):
        return False
    return not isinstance(exc, dbapi.Error) or isinstance(
        exc, dbapi.OperationalError | dbapi.InterfaceError
    )


@asynccontextmanager
async def driver_transaction(
    engine: AsyncEngine, display_url: str, listeners: Sequence[Callable[[str], None]] = ()
) -> AsyncIterator[DriverRunner]:
    """One write transaction on a pooled connection's driver (see the module docstring);
    `listeners` see each statement's text (`DriverRunner`)."""
    dbapi: Any = engine.dialect.loaded_dbapi
    async with translate_errors(display_url):
        try:
            fairy = await engine.raw_connection()
        except Exception as exc:
            # The pool hands back the driver's own error when it cannot connect.
            store_error = translate_driver(exc, dbapi, display_url)
            if store_error is None:
                raise
            raise store_error from exc
    broken = False
    try:
        conn: Any = fairy.driver_connection
        cursor = conn.cursor()
        try:
            yield DriverRunner(cursor, engine.dialect, listeners)
            # A buffered cursor holds nothing on the server; closing it sends nothing.
            await cursor.close()
            await conn.commit()
        except BaseException as exc:
            broken = _link_may_be_broken(exc, dbapi) or not await _rolled_back(conn)
            store_error = translate_driver(exc, dbapi, display_url)
            if store_error is not None:
                raise store_error from exc
            raise
    finally:
        await greenlet_spawn(fairy.invalidate if broken else fairy.close)


async def _rolled_back(conn: Any) -> bool:
    """Roll back after a clean error; False when even that failed (the link is then
    suspect)."""
    try:
        await conn.rollback()
    except Exception:
        return False
    return True
