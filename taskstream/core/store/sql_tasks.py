"""Store methods over task definitions, their cursors and the explain log (the statements
are in `sql_definitions`): mixed into `SqlStore`, one transaction each."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.store import sql_definitions as defs
from taskstream.core.store.port import DecisionRow, DefinitionRecord
from taskstream.core.store.sql_engine import upsert_retrying


class DefinitionMethods:
    """Definitions, cursors and the explain log: mixed into `SqlStore`; relies on its
    `_read` / `_write` transaction helpers."""

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    def _write(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def upsert_definitions(
        self, records: list[DefinitionRecord], *, now_ms: int | None = None
    ) -> dict[str, str]:
        """Insert or update; task_id -> "created" | "updated" | "unchanged". `paused` is only
        taken from a record when the definition is created; `now_ms` (the database clock when
        None) is when a created or changed `schedule` takes effect."""
        return await upsert_retrying(
            self._write, lambda conn: defs.upsert(conn, records, now_ms), "definitions"
        )

    async def apply_definitions(
        self,
        records: list[DefinitionRecord],
        upstreams: Mapping[str, Mapping[str, Any]],
        *,
        now_ms: int | None = None,
    ) -> tuple[dict[str, str], dict[str, str]]:
        """`upsert_definitions` and `upsert_upstreams` in one transaction: a failure stores
        neither. Returns (task_id -> change, upstream name -> change)."""

        async def both(conn: AsyncConnection) -> tuple[dict[str, str], dict[str, str]]:
            changes = await defs.upsert(conn, records, now_ms)
            return changes, await defs.upsert_upstreams(conn, upstreams)

        return await upsert_retrying(self._write, both, "definitions")

    async def list_definitions(self) -> list[DefinitionRecord]:
        """Every definition, by task id."""
        async with self._read() as conn:
            return await defs.list_all(conn)

    async def definitions_version(self) -> str:
        """Changes whenever any definition is added, changed or paused."""
        async with self._read() as conn:
            return await defs.version(conn)

    async def set_paused(self, task_id: str, paused: bool) -> bool | None:
        """Pause or resume: True when the flag changed, False when it was already so, None
        when the task is not defined."""
        async with self._write() as conn:
            return await defs.set_paused(conn, task_id, paused)

    async def get_cursor(self, task_id: str) -> int | None:
        """The last fire time (ms) the scheduler has decided for this task."""
        async with self._read() as conn:
            return await defs.get_cursor(conn, task_id)

    async def max_cursor_token(self) -> int | None:
        """The largest leader token any cursor was written with; None when none was."""
        async with self._read() as conn:
            return await defs.max_cursor_token(conn)

    async def set_cursor(
        self, task_id: str, fire_time_ms: int, *, token: int | None = None
    ) -> bool:
        """Store the cursor, fenced by `token` when given (see the port)."""
        async with self._write() as conn:
            return await defs.set_cursor(conn, task_id, fire_time_ms, token)

    async def claim_cursors(self, token: int) -> int:
        """Fence every cursor with a new leader's `token` (see the port)."""
        async with self._write() as conn:
            return await defs.claim_cursors(conn, token)

    async def record_decision(self, row: DecisionRow, *, token: int | None = None) -> bool:
        """Append a scheduling decision (`decided_at_ms <= 0`: the database clock's now),
        fenced by `token` when given (see the port)."""
        async with self._write() as conn:
            return await defs.record_decision(conn, row, token)

    async def decisions(
        self, task_id: str, *, since_ms: int | None = None, limit: int = 100
    ) -> list[DecisionRow]:
        """Decisions oldest first: from `since_ms` on, or the latest `limit` without it."""
        async with self._read() as conn:
            return await defs.decisions(conn, task_id, since_ms, limit)
