"""Statements on `task_definitions` (specs, pause, cursor), `upstreams` and
`trigger_decisions`.

`updated_at_ms` of a definition strictly increases on every change (db-now, or the previous
value + 1 when the clock has not moved past it), so `definitions_version` changes with every
insert, edit and pause even when two changes fall in the same millisecond.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, case, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.errors import StoreCorrupt
from taskstream.core.store import sql_chunks
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import DecisionRow, DefinitionRecord
from taskstream.core.store.sql_prepared import CoreRunner, Runner
from taskstream.core.store.tables import task_definitions as defs
from taskstream.core.store.tables import trigger_decisions as decs
from taskstream.core.store.tables import upstreams as ups


def _bumped_updated_at() -> ColumnElement[int]:
    now = db_now_ms()
    return case((now > defs.c.updated_at_ms, now), else_=defs.c.updated_at_ms + 1)


async def upsert(
    conn: AsyncConnection, records: list[DefinitionRecord], now_ms: int | None = None
) -> dict[str, str]:
    """Insert new definitions, update changed ones (spec text or hash differ), keep the rest.

    An update never touches `paused`: pausing is operator state that survives a re-apply.
    `schedule_from_ms` is `now_ms` (db-now when None) at creation and at an update that changes
    the `schedule`.
    Every apply first takes the lock of `_newest_token`, so two applies editing the same
    tasks in different orders wait for each other instead of deadlocking.
    Returns task_id -> "created" | "updated" | "unchanged".
    """
    if not records:
        return {}
    ids = sorted({r.task_id for r in records})
    token = await _newest_token(conn)
    stored = await _stored_specs(conn, ids)
    since = db_now_ms() if now_ms is None else now_ms
    outcome: dict[str, str] = {}
    for record in records:
        spec = codec.dumps(record.spec, what=f"spec of task {record.task_id!r}")
        current = stored.get(record.task_id)
        if current is None:
            await conn.execute(
                insert(defs).values(
                    task_id=record.task_id,
                    spec=spec,
                    spec_hash=record.spec_hash,
                    paused=record.paused,
                    cursor_token=token,
                    created_at_ms=db_now_ms(),
                    updated_at_ms=db_now_ms(),
                    schedule_from_ms=since,
                )
            )
            outcome[record.task_id] = "created"
        elif current == (spec, record.spec_hash):
            outcome.setdefault(record.task_id, "unchanged")
        else:
            changed: dict[str, object] = {"spec": spec, "spec_hash": record.spec_hash}
            if record.spec.get("schedule") != _stored_schedule(record.task_id, current[0]):
                changed["schedule_from_ms"] = since
            await conn.execute(
                update(defs)
                .where(defs.c.task_id == record.task_id)
                .values(**changed, updated_at_ms=_bumped_updated_at())
            )
            outcome[record.task_id] = outcome.get(record.task_id) or "updated"
        stored[record.task_id] = (spec, record.spec_hash)
    return outcome


async def upsert_upstreams(
    conn: AsyncConnection, configs: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Insert or replace upstream configs by name (the others are kept); name -> "created" |
    "updated" | "unchanged"."""
    out: dict[str, str] = {}
    for name, config in sorted(configs.items()):
        text = codec.dumps(dict(config), what=f"upstream {name}")
        stmt = select(ups.c.config).where(ups.c.name == name)
        old = (await conn.execute(stmt)).scalar_one_or_none()
        if old == text:
            out[name] = "unchanged"
            continue
        values = {"config": text, "updated_at_ms": db_now_ms()}
        if old is None:
            await conn.execute(ups.insert().values(name=name, **values))
        else:
            await conn.execute(ups.update().where(ups.c.name == name).values(**values))
        out[name] = "updated" if old is not None else "created"
    return out


async def _stored_specs(conn: AsyncConnection, ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(spec text, hash) of each of `ids` that is stored, read `sql_chunks.CHUNK` ids per statement:
    a file of more tasks than a driver takes bound parameters (PostgreSQL 32767) applies."""
    cols = (defs.c.task_id, defs.c.spec, defs.c.spec_hash)
    stored: dict[str, tuple[str, str]] = {}
    for part in sql_chunks.chunks(ids):
        for row in await conn.execute(select(*cols).where(defs.c.task_id.in_(part))):
            stored[row.task_id] = (row.spec, row.spec_hash)
    return stored


_UNREADABLE = object()
"""The schedule of a stored spec that cannot be read: equal to no schedule."""


def _stored_schedule(task_id: str, spec: str) -> object:
    """The `schedule` of a stored spec (JSON text), None for a task without one. A spec that
    is not JSON (a hand edit) has a schedule unlike any: the apply that mends it starts its
    schedule anew."""
    try:
        loaded = codec.loads(spec, where=f"task_definitions row {task_id!r}: spec")
    except StoreCorrupt:
        return _UNREADABLE
    return loaded.get("schedule") if isinstance(loaded, dict) else None


async def _newest_token(conn: AsyncConnection) -> int | None:
    """The newest leader token on any task, for a task created now: a leader older than the
    one that took every task over records nothing for it either. Read under an exclusive
    lock on every definition, so a takeover in progress (`claim_cursors`) commits first.
    Exclusive, not shared: the apply may update some of these rows next, and two applies (or
    an apply and a takeover) each holding a shared lock and wanting to write would deadlock;
    this way the second waits for the first."""
    # Every row, not MAX(): PostgreSQL locks no rows under an aggregate.
    tokens = select(defs.c.cursor_token).with_for_update()
    held = [int(t) for t in (await conn.execute(tokens)).scalars() if t is not None]
    return max(held, default=None)


async def list_all(conn: AsyncConnection) -> list[DefinitionRecord]:
    """Every definition, by task id."""
    stmt = select(defs).order_by(defs.c.task_id)
    return [codec.definition_record(r) for r in (await conn.execute(stmt)).mappings().all()]


async def version(conn: AsyncConnection) -> str:
    """`count:sum(updated_at_ms):paused count`; see the module docstring for why it moves."""
    paused = func.sum(case((defs.c.paused, 1), else_=0))
    stmt = select(func.count(), func.sum(defs.c.updated_at_ms), paused)
    count, total, paused_count = (await conn.execute(stmt)).one()
    return f"{int(count)}:{int(total or 0)}:{int(paused_count or 0)}"


async def set_paused(conn: AsyncConnection, task_id: str, paused: bool) -> bool | None:
    """Set the pause flag: True when it changed, False when it was already so (nothing is
    written: the version does not move), None when the task is not defined. Of two at once,
    the second waits for the first's row lock and finds the flag set."""
    stmt = (
        update(defs)
        .where(defs.c.task_id == task_id, defs.c.paused != paused)
        .values(paused=paused, updated_at_ms=_bumped_updated_at())
    )
    if (await conn.execute(stmt)).rowcount == 1:
        return True
    found = await conn.execute(select(defs.c.task_id).where(defs.c.task_id == task_id))
    return None if found.first() is None else False


async def get_cursor(conn: AsyncConnection, task_id: str) -> int | None:
    """The last decided fire time (ms), None when never set or the task is not defined."""
    stmt = select(defs.c.cursor_ms).where(defs.c.task_id == task_id)
    value = (await conn.execute(stmt)).scalar_one_or_none()
    return None if value is None else int(value)


async def max_cursor_token(conn: AsyncConnection) -> int | None:
    """The largest leader token any cursor was written with; None when none was."""
    value = (await conn.execute(select(func.max(defs.c.cursor_token)))).scalar_one_or_none()
    return None if value is None else int(value)


async def set_cursor(
    conn: AsyncConnection, task_id: str, fire_time_ms: int, token: int | None
) -> bool:
    """Store the cursor. Not a definition change: the version does not move. With a `token`
    (the writer's leader-lease token) the write happens only if no newer token wrote before;
    False when rejected or the task is not defined."""
    stmt = update(defs).where(defs.c.task_id == task_id)
    if token is not None:
        stmt = stmt.where(or_(defs.c.cursor_token.is_(None), defs.c.cursor_token <= token))
        stmt = stmt.values(cursor_ms=fire_time_ms, cursor_token=token)
    else:
        stmt = stmt.values(cursor_ms=fire_time_ms)
    return (await conn.execute(stmt)).rowcount == 1


async def claim_cursors(conn: AsyncConnection, token: int) -> int:
    """Raise every cursor's token below `token` to it (a new leader taking the tasks over),
    so that from this commit on `set_cursor`, `record_decision` and the creation of instances
    (`sql_outbox`) refuse older tokens.
    Returns how many definitions changed hands."""
    stmt = (
        update(defs)
        .where(or_(defs.c.cursor_token.is_(None), defs.c.cursor_token < token))
        .values(cursor_token=token)
    )
    return int((await conn.execute(stmt)).rowcount)


async def newer_held(run: Runner, writes: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
    """Of the (task id, leader token) pairs a writer is about to write under, those whose task
    holds a newer token: a newer scheduler leads them, so the write is refused (a task with no
    token, or not defined, fences nothing). The tokens are read under a shared lock held until
    commit (`sql_templates.leader_tokens`), so a takeover in progress commits first and one
    that comes later waits for this transaction."""
    held: dict[str, int] = {}
    for part in sql_chunks.chunks(sorted({task_id for task_id, _ in writes})):
        for m in await run.rows(*templates.bind_leader_tokens(part)):
            if m["cursor_token"] is not None:
                held[str(m["task_id"])] = int(m["cursor_token"])
    return {(task_id, token) for task_id, token in writes if held.get(task_id, token) > token}


async def record_decision(conn: AsyncConnection, row: DecisionRow, token: int | None) -> bool:
    """Append to the explain log; `decided_at_ms <= 0` means "now" on the database clock.
    With a `token` (the writer's leader-lease token) nothing is written, and False returned,
    when the task holds a newer token (`newer_held`), so a new leader's `claim_cursors` waits
    for this record and then reads it back."""
    if token is not None and await newer_held(CoreRunner(conn), [(row.task_id, token)]):
        return False
    decided_at = row.decided_at_ms if row.decided_at_ms > 0 else db_now_ms()
    await conn.execute(
        insert(decs).values(
            task_id=row.task_id,
            fire_time_ms=row.fire_time_ms,
            decision=row.decision,
            reason=codec.reason(row.reason),
            details=codec.dumps(row.details, what="decision details"),
            instance_id=row.instance_id,
            decided_at_ms=decided_at,
        )
    )
    return True


async def decisions(
    conn: AsyncConnection, task_id: str, since_ms: int | None, limit: int
) -> list[DecisionRow]:
    """Decisions by fire time (then insertion), oldest first: the first `limit` at or after
    `since_ms`, or, without `since_ms`, the latest `limit`."""
    stmt = select(decs).where(decs.c.task_id == task_id).limit(max(limit, 0))
    if since_ms is None:
        stmt = stmt.order_by(decs.c.fire_time_ms.desc(), decs.c.id.desc())
    else:
        stmt = stmt.where(decs.c.fire_time_ms >= since_ms)
        stmt = stmt.order_by(decs.c.fire_time_ms, decs.c.id)
    rows = [codec.decision_row(r) for r in (await conn.execute(stmt)).mappings().all()]
    return rows[::-1] if since_ms is None else rows
