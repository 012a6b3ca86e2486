"""Store operations the scheduler needs beyond instances: readiness markers, the active
instances of a task (for overlap policies) and which of a set of instances exist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.errors import ClaimLost, StoreCorrupt
from taskstream.core.states import Status
from taskstream.core.store import sql_codec as codec
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import InstanceRow, UnreadableRow
from taskstream.core.store.sql_chunks import chunks
from taskstream.core.store.sql_definitions import upsert_upstreams
from taskstream.core.store.sql_engine import upsert_retrying
from taskstream.core.store.sql_errors import ConstraintViolation
from taskstream.core.store.sql_prepared import CoreRunner
from taskstream.core.store.sql_queries import lock_states
from taskstream.core.store.tables import readiness_markers as markers
from taskstream.core.store.tables import task_instances as inst
from taskstream.core.store.tables import upstreams as ups


class SchedulingMethods:
    """Mixed into `SqlStore`; relies on its `_read` / `_write` transaction helpers."""

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    def _write(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def mark_ready(
        self, name: str, business_date: str, *, claim: tuple[str, int] | None = None
    ) -> bool:
        """Set the readiness marker `name` for a business date; False when it was already set.
        With `claim` (instance id, token) the marker is fenced like a commit: set only while
        the instance is RUNNING at that token (its row locked meanwhile, so no claim of a
        newer attempt lands in between); `ClaimLost` otherwise, and nothing is set."""
        try:
            async with self._write() as conn:
                if claim is not None:
                    await _hold(conn, *claim)
                await conn.execute(
                    markers.insert().values(
                        name=name, business_date=business_date, created_at_ms=db_now_ms()
                    )
                )
        except ConstraintViolation:
            return False
        return True

    async def ready_markers(self, names: Sequence[str], business_date: str) -> set[str]:
        """Which of `names` are set for `business_date`."""
        if not names:
            return set()
        stmt = select(markers.c.name).where(
            markers.c.name.in_(list(names)), markers.c.business_date == business_date
        )
        async with self._read() as conn:
            return {str(n) for n in (await conn.execute(stmt)).scalars().all()}

    async def upsert_upstreams(self, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Insert or replace upstream limits by name; name -> "created" | "updated" |
        "unchanged". Upstreams missing from `configs` are kept. A concurrent apply that
        inserts the same new upstream first makes this one read again and update it."""
        return await upsert_retrying(
            self._write, lambda conn: upsert_upstreams(conn, configs), "upstreams"
        )

    async def list_upstreams(self) -> dict[str, dict[str, Any]]:
        """Every stored upstream's limits, by name."""
        async with self._read() as conn:
            rows = (await conn.execute(select(ups.c.name, ups.c.config))).all()
        return {str(name): _config(name, config) for name, config in rows}

    async def next_retry_at(self, *, after_ms: int | None = None) -> int | None:
        """The earliest `next_attempt_at_ms` of any RETRYING row (ms), of those due after
        `after_ms` when given; None when none waits."""
        stmt = select(func.min(inst.c.next_attempt_at_ms)).where(
            inst.c.settled.is_(None),
            inst.c.next_attempt_at_ms.is_not(None),
            inst.c.status == Status.RETRYING.value,
        )
        if after_ms is not None:
            stmt = stmt.where(inst.c.next_attempt_at_ms > after_ms)
        async with self._read() as conn:
            value = (await conn.execute(stmt)).scalar_one_or_none()
        return None if value is None else int(value)

    async def active_instances(
        self, task_id: str, *, limit: int = 10, newest_first: bool = False
    ) -> list[InstanceRow | UnreadableRow]:
        """Up to `limit` instances of `task_id` not yet settled, oldest fire time first (the
        newest first with `newest_first`); one that does not decode as an `UnreadableRow` in
        its place."""
        order = [inst.c.scheduled_for_ms, inst.c.id]
        stmt = (
            select(inst)
            .where(inst.c.task_id == task_id, inst.c.settled.is_(None))
            .order_by(*(c.desc() for c in order) if newest_first else order)
            .limit(limit)
        )
        async with self._read() as conn:
            return [codec.instance_or_unreadable(m) for m in (await conn.execute(stmt)).mappings()]

    async def existing_instances(self, instance_ids: Sequence[str]) -> set[str]:
        """Those of `instance_ids` that exist, read `sql_chunks.CHUNK` ids at a time."""
        found: set[str] = set()
        async with self._read() as conn:
            for part in chunks(instance_ids):
                stmt = select(inst.c.id).where(inst.c.id.in_(list(part)))
                found.update((await conn.execute(stmt)).scalars())
        return found


async def _hold(conn: AsyncConnection, instance_id: str, token: int) -> None:
    """Lock the instance row; `ClaimLost` unless it is RUNNING at `token`."""
    seen = (await lock_states(CoreRunner(conn), [instance_id])).get(instance_id)
    if seen is None or seen.status is not Status.RUNNING or seen.attempt != token:
        found = "no row" if seen is None else f"{seen.status} at attempt {seen.attempt}"
        raise ClaimLost(f"instance {instance_id}: claim {token} no longer held ({found})")


def _config(name: object, config: str) -> dict[str, Any]:
    """A stored upstream's config (a JSON object); `StoreCorrupt` naming it when it is not."""
    where = f"upstreams row {str(name)[:200]!r}: config"
    loaded = codec.loads(config, where=where)
    if not isinstance(loaded, dict):
        raise StoreCorrupt(f"{where} is not a JSON object; left as it is")
    return loaded
