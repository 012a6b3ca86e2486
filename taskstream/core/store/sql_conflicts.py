"""Transactions the database rolls back to settle a conflict with another, sent again at once.

A deadlock (MySQL / MariaDB error 1213, PostgreSQL 40P01), a row lock waited for longer than
the lock wait timeout (1205, PostgreSQL's `lock_timeout` 55P03) and a serialization failure
(40001) end a transaction that wrote nothing: the server rolled it back (all of it, or for
1205 the statement, and the store then rolls back the rest). They are raised by a statement,
never by COMMIT, so a transaction that met one did not land. Another try, in a new
transaction, meets the rows as the other transaction left them and decides each
compare-and-set again: a conflict is not the store being away, and is not waited out as an
outage unless it keeps coming (`StoreConflict` after `TRANSACTION_TRIES`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from taskstream.core.errors import StoreConflict

TRANSACTION_TRIES = 4
"""Tries in all of a transaction the database keeps rolling back for a conflict."""
LOCK_WAIT_TRIES = 2
"""Tries in all when the conflict is a lock wait timeout: each has waited the server's whole
timeout (InnoDB's default is 50 s), so a lease extension must not wait four of them."""
CONFLICT_PAUSE_S = 0.02
"""Pause before the n-th try again (seconds, times n): lets the winner of a deadlock commit."""

_MYSQL_CONFLICTS = frozenset({1205, 1213})
_PG_CONFLICTS = frozenset({"40001", "40P01", "55P03"})
_MYSQL_LOCK_WAIT, _PG_LOCK_WAIT = 1205, "55P03"

T = TypeVar("T")


def _codes(exc: BaseException) -> tuple[str, object]:
    """The PostgreSQL SQLSTATE ("" when none) and the MySQL error number (first argument) of
    a driver error, or of the one SQLAlchemy wraps."""
    cause: Any = getattr(exc, "orig", None) or exc
    args: tuple[Any, ...] = getattr(cause, "args", ())
    return str(getattr(cause, "sqlstate", None) or ""), args[0] if args else None


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` (a driver error, or SQLAlchemy's wrapper of one) is a conflict the
    database settled by rolling back: see the module docstring."""
    state, errno = _codes(exc)
    return state in _PG_CONFLICTS or (isinstance(errno, int) and errno in _MYSQL_CONFLICTS)


def conflict_error(exc: BaseException, display_url: str, detail: str) -> StoreConflict | None:
    """The `StoreConflict` for a conflict (`is_conflict`), marked `lock_wait` for a lock wait
    timeout; None for any other error. `detail`: the error's text for the message."""
    if not is_conflict(exc):
        return None
    state, errno = _codes(exc)
    return StoreConflict(
        f"store {display_url} rolled back a conflict: {detail}",
        lock_wait=state == _PG_LOCK_WAIT or errno == _MYSQL_LOCK_WAIT,
    )


async def conflicts_retried(transaction: Callable[[], Awaitable[T]]) -> T:
    """`transaction()` (one whole transaction, from its BEGIN), made again while it raises
    `StoreConflict`, at most `TRANSACTION_TRIES` times in all (`LOCK_WAIT_TRIES` once a
    lock wait timeout came); the last conflict is raised."""
    tries = 1
    while True:
        try:
            return await transaction()
        except StoreConflict as exc:
            if tries >= (LOCK_WAIT_TRIES if exc.lock_wait else TRANSACTION_TRIES):
                raise
        await asyncio.sleep(CONFLICT_PAUSE_S * tries)
        tries += 1
