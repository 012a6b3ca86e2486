"""Watching the SQL a store sends: which statements, in order, while a block runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection

from taskstream.core.store.sql import SqlStore

READS_AND_WRITES = ("SELECT", "UPDATE", "INSERT")


@contextmanager
def statements(store: SqlStore, kinds: tuple[str, ...] = READS_AND_WRITES) -> Iterator[list[str]]:
    """Collect the statements sent while the block runs whose text starts with one of `kinds`
    (compared in upper case, leading spaces ignored)."""
    sent: list[str] = []

    def record(conn: Connection, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.lstrip().upper().startswith(kinds):
            sent.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)
