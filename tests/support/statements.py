"""Watching the SQL a store sends: which statements, in order, while a block runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.engine.default import CACHE_HIT

from taskstream.core.store.sql import SqlStore

READS_AND_WRITES = ("SELECT", "UPDATE", "INSERT")


@contextmanager
def statements(store: SqlStore, kinds: tuple[str, ...] = READS_AND_WRITES) -> Iterator[list[str]]:
    """Collect the statements sent while the block runs, by the engine or on the driver
    path, whose text starts with one of `kinds` (compared in upper case, leading spaces
    ignored)."""
    sent: list[str] = []

    def keep(statement: str) -> None:
        if statement.lstrip().upper().startswith(kinds):
            sent.append(statement)

    def record(conn: Connection, cursor: Any, statement: str, *rest: Any) -> None:
        keep(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    store.statement_listeners.append(keep)
    try:
        yield sent
    finally:
        store.statement_listeners.remove(keep)
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)


@dataclass(frozen=True, slots=True)
class Call:
    """One statement as the driver got it: its text, and whether its compiled form came from
    the engine's cache."""

    statement: str
    cached: bool


@contextmanager
def calls(store: SqlStore, prefix: str) -> Iterator[list[Call]]:
    """Collect the driver calls of statements starting with `prefix` (upper case) while the
    block runs."""
    sent: list[Call] = []

    def record(
        conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if statement.lstrip().upper().startswith(prefix):
            sent.append(Call(statement, context.cache_hit is CACHE_HIT))

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)
