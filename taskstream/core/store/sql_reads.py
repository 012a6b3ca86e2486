"""Reads of instances and their history, for operators and the loops that find work (the
scheduler's due retries, the reconciler's stale rows). Each is one read-only transaction; the
SQL lives in `sql_instances` and `sql_queries`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.states import Status
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as queries
from taskstream.core.store.port import HistoryRow, InstanceRow, StatusCounts, UnreadableRow


class ReadMethods:
    """Mixed into `SqlStore`; relies on its `_read` transaction helper."""

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def get_instance(self, instance_id: str) -> InstanceRow | None:
        """One instance, None when it does not exist."""
        async with self._read() as conn:
            return await rows.get(conn, instance_id)

    async def list_instances(
        self, *, task_id: str | None = None, status: Status | None = None, limit: int = 100
    ) -> list[InstanceRow]:
        """Matching instances, oldest `scheduled_for_ms` first, at most `limit`. Oldest first
        so that loops working a backlog (reconciler, retries) never starve its oldest rows."""
        async with self._read() as conn:
            return await rows.list_rows(conn, task_id, status, limit)

    async def list_instances_or_unreadable(
        self, *, task_id: str | None = None, status: Status | None = None, limit: int = 100
    ) -> list[InstanceRow | UnreadableRow]:
        """`list_instances`, with a row that does not decode as an `UnreadableRow` in its
        place."""
        async with self._read() as conn:
            return await rows.list_rows_or_unreadable(conn, task_id, status, limit)

    async def count_by_status(self) -> StatusCounts:
        """Every status with its instance count (0 when none), and the rows of a status no
        state has named instead of counted."""
        async with self._read() as conn:
            return await rows.count_by_status(conn)

    async def history(self, instance_id: str) -> list[HistoryRow]:
        """An instance's status changes, oldest first."""
        async with self._read() as conn:
            return await rows.history(conn, instance_id)

    async def histories(self, instance_ids: Sequence[str]) -> dict[str, list[HistoryRow]]:
        """`history` of many instances in one read; ids without history are left out."""
        async with self._read() as conn:
            return await rows.histories(conn, instance_ids)

    async def due_retries(
        self, *, now_ms: int, limit: int, after: tuple[int, str] | None = None
    ) -> list[InstanceRow | UnreadableRow]:
        """RETRYING rows with `next_attempt_at_ms <= now_ms`, earliest due first (then id),
        past `after` ((next_attempt_at_ms, id)) when given; one that does not decode as an
        `UnreadableRow` in its place."""
        async with self._read() as conn:
            return await queries.due_retries(conn, now_ms, limit, after)

    async def stale(
        self,
        statuses: list[Status],
        *,
        updated_before_ms: int,
        limit: int,
        after: tuple[int, str] | None = None,
    ) -> list[InstanceRow | UnreadableRow]:
        """Rows in `statuses` with `updated_at_ms < updated_before_ms`, oldest first (then by
        id), past `after` ((updated_at_ms, id)) when given; one that does not decode as an
        `UnreadableRow` in its place."""
        async with self._read() as conn:
            return await queries.stale(conn, statuses, updated_before_ms, limit, after)

    async def poisoned(
        self, *, limit: int, before: tuple[int, str] | None = None
    ) -> list[InstanceRow | UnreadableRow]:
        """FAILED `poison` rows, the latest failure first (`updated_at_ms`, then id, both
        descending), before `before` ((updated_at_ms, id)) when given."""
        async with self._read() as conn:
            return await queries.poisoned(conn, limit, before)

    async def side_effect_done(self, key: str) -> bool:
        """True when a side effect with this idempotency key has been committed."""
        async with self._read() as conn:
            return await queries.side_effect_done(conn, key)

    async def count_history(self, instance_id: str, *, reason: str) -> int:
        """How many history rows of this instance carry `reason`."""
        async with self._read() as conn:
            return await queries.count_history(conn, instance_id, reason)
