"""Shared parts of the store batch tests: instances inserted in bulk in one state, instances
walked to DISPATCHED or claimed, and a side-effect key recorded as another run's."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import insert

from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import side_effects, task_instances
from tests.contract.conftest import Advance, MakeNew

T0_MS = 1_700_000_000_000


async def _seed(
    store: SqlStore,
    names: Iterable[str],
    *,
    status: Status = Status.DISPATCHED,
    attempt: int = 0,
    owner: str | None = None,
) -> list[str]:
    """Insert instances directly in one state (no history): fast setup for many rows."""
    values = [
        {
            "id": f"inst-{n}",
            "task_id": "report",
            "agent": "echo",
            "dedupe_key": f"report:{n}",
            "status": status.value,
            "attempt": attempt,
            "max_attempts": 3,
            "priority": "default",
            "scheduled_for_ms": T0_MS,
            "payload": "{}",
            "context": "{}",
            "trace_id": "",
            "lease_owner": owner,
            "lease_expires_at_ms": None if owner is None else T0_MS,
            "created_at_ms": T0_MS,
            "updated_at_ms": T0_MS,
        }
        for n in names
    ]
    async with store.engine.begin() as conn:
        await conn.execute(insert(task_instances), values)
    return [str(v["id"]) for v in values]


async def _dispatched(store: SqlStore, make_new: MakeNew, advance: Advance, name: str) -> str:
    await store.create_instance(make_new(name))
    await advance(f"inst-{name}", Status.DISPATCHED)
    return f"inst-{name}"


async def _running(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str, owner: str = "exec-1"
) -> tuple[str, int]:
    instance_id = await _dispatched(store, make_new, advance, name)
    claim = await store.claim(instance_id, expected_attempt=0, owner=owner, lease_s=30)
    assert claim is not None
    return instance_id, claim.token


async def _record_key(store: SqlStore, key: str) -> None:
    """Record `key` as committed by another run."""
    async with store.engine.begin() as conn:
        row = {"idempotency_key": key, "instance_id": "other", "attempt": 1, "created_at_ms": 0}
        await conn.execute(insert(side_effects).values(row))
