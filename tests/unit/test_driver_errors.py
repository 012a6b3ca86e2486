"""How MySQL / MariaDB error replies, as the asyncmy driver raises them, are classified on the
driver path: the errors of a failover to a read-only replica and of a full server are the
store being away (waited out), a deadlock and a lock wait timeout are conflicts (made again at
once), and none of them is a refusal that would end a run."""

from __future__ import annotations

import struct

import asyncmy
import asyncmy.errors
import pytest

from taskstream.core.errors import StoreConflict, StoreError, StoreUnavailable
from taskstream.core.store import sql_conflicts
from taskstream.core.store.sql_driver import translate_driver


def _reply(errno: int, message: str) -> BaseException:
    """The exception asyncmy raises for a server's error packet with `errno`."""
    packet = b"\xff" + struct.pack("<H", errno) + b"#HY000" + message.encode()
    try:
        asyncmy.errors.raise_mysql_exception(packet)
    except asyncmy.errors.MySQLError as exc:
        return exc
    raise AssertionError("no exception raised")


def _translated(errno: int, message: str) -> StoreError | None:
    return translate_driver(_reply(errno, message), asyncmy, "db")


@pytest.mark.parametrize(
    ("errno", "message"),
    [
        (1290, "The MariaDB server is running with the --read-only option"),
        (1836, "Running in read-only mode"),
        (1040, "Too many connections"),
    ],
)
def test_a_read_only_or_full_server_is_an_outage(errno: int, message: str) -> None:
    error = _translated(errno, message)
    assert isinstance(error, StoreUnavailable), error
    assert not isinstance(error, StoreConflict)


@pytest.mark.parametrize(
    ("errno", "message"),
    [
        (1213, "Deadlock found when trying to get lock; try restarting transaction"),
        (1205, "Lock wait timeout exceeded; try restarting transaction"),
    ],
)
def test_a_deadlock_or_lock_wait_timeout_is_a_conflict(errno: int, message: str) -> None:
    assert isinstance(_translated(errno, message), StoreConflict)


@pytest.mark.parametrize(
    ("errno", "message", "tries"),
    [
        (1213, "Deadlock found when trying to get lock; try restarting transaction", 4),
        (1205, "Lock wait timeout exceeded; try restarting transaction", 2),
    ],
)
async def test_a_lock_wait_timeout_is_tried_again_once_a_deadlock_more(
    errno: int, message: str, tries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock wait timeout has already waited the server's whole timeout (50 s by default):
    one more try, not three, so that a lease extension does not wait four of them."""
    monkeypatch.setattr(sql_conflicts, "CONFLICT_PAUSE_S", 0.0)
    calls = 0

    async def transaction() -> None:
        nonlocal calls
        calls += 1
        error = _translated(errno, message)
        assert isinstance(error, StoreConflict)
        raise error

    with pytest.raises(StoreConflict):
        await sql_conflicts.conflicts_retried(transaction)
    assert calls == tries
