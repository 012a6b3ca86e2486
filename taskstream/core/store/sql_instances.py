"""Statements on `task_instances`, `instance_history` and `side_effects`.

Each function runs inside a transaction the caller owns (`SqlStore`), so a status change and
its history row commit or roll back together. Status writes are compare-and-set:
`UPDATE ... WHERE id = :id AND status = :src [AND attempt = :attempt]`; a rowcount of 0 means
the race was lost. Times come from `db_now_ms()`, never from this process's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, String, func, insert, literal, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.states import FailClass, Status
from taskstream.core.store import sql_codec as codec
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import HistoryRow, InstanceRow, NewInstance, UnreadableRow
from taskstream.core.store.records import StatusCounts
from taskstream.core.store.sql_chunks import chunks
from taskstream.core.store.sql_queries import resolve_reviews
from taskstream.core.store.tables import NOTE_LEN, OWNER_LEN, STATUS_LEN, side_effects
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.store.tables import task_instances as inst


def lease_ms(lease_s: float) -> int:
    """A lease length in whole milliseconds; `ValueError` unless `lease_s` is positive."""
    if not lease_s > 0:
        raise ValueError(f"lease_s must be positive, got {lease_s!r}")
    return round(lease_s * 1000)


def status_values(
    dst: Status,
    fail_class: FailClass | None,
    error: str | None,
    next_attempt_at_ms: int | None,
) -> dict[str, Any]:
    """Columns a move to `dst` sets: `fail_class` (None unless FAILED), `next_attempt_at_ms`
    (None clears it), `last_error` only when `error` is given, and a cleared lease unless
    `dst` is RUNNING."""
    values: dict[str, Any] = {
        "status": dst.value,
        "fail_class": None if fail_class is None else fail_class.value,
        "next_attempt_at_ms": next_attempt_at_ms,
    }
    if dst is not Status.RUNNING:
        values |= {"lease_owner": None, "lease_expires_at_ms": None}
    if error is not None:
        values["last_error"] = codec.error_text(error)
    return values


def claim_values(owner: str, lease_length_ms: int) -> dict[str, Any]:
    """Columns a claim sets: RUNNING, attempt + 1, the lease to db-now + `lease_length_ms`."""
    values = status_values(Status.RUNNING, None, None, None)
    values |= {
        "attempt": inst.c.attempt + 1,
        "lease_owner": owner,
        "lease_expires_at_ms": db_now_ms() + lease_length_ms,
    }
    return values


def instance_values(new: NewInstance) -> dict[str, Any]:
    """The columns of `new`'s PENDING row at attempt 0, times left out."""
    return {
        "id": new.id,
        "task_id": new.task_id,
        "agent": new.agent,
        "dedupe_key": new.dedupe_key,
        "status": Status.PENDING.value,
        "attempt": 0,
        "max_attempts": new.max_attempts,
        "priority": new.priority,
        "scheduled_for_ms": new.scheduled_for_ms,
        "business_date": new.business_date,
        "payload": codec.dumps(new.payload, what="payload"),
        "context": codec.dumps({}, what="context"),
        "not_before_ms": new.not_before_ms,
        "deadline_ms": new.deadline_ms,
        "trace_id": new.trace_id,
    }


async def insert_instance(conn: AsyncConnection, new: NewInstance) -> None:
    """INSERT a PENDING row at attempt 0. A taken id or dedupe key raises an IntegrityError
    (`ConstraintViolation` once `SqlStore` translated it)."""
    now = db_now_ms()
    values = instance_values(new) | {"created_at_ms": now, "updated_at_ms": now}
    await conn.execute(insert(inst).values(**values))


async def existing_id(conn: AsyncConnection, new: NewInstance) -> str | None:
    """The id of the row holding `new`'s dedupe key, else `new.id` if that id is taken."""
    by_key = select(inst.c.id).where(inst.c.dedupe_key == new.dedupe_key)
    found = (await conn.execute(by_key)).scalar_one_or_none()
    if found is None:
        by_id = select(inst.c.id).where(inst.c.id == new.id)
        found = (await conn.execute(by_id)).scalar_one_or_none()
    return None if found is None else str(found)


async def cas_update(
    conn: AsyncConnection,
    instance_id: str,
    src: Status,
    attempt: int | None,
    values: Mapping[str, Any],
    lease_until: int | None = None,
) -> bool:
    """Apply `values` (plus `updated_at_ms`) where status == src [and attempt == attempt]
    [and lease_expires_at_ms == lease_until].

    True when the row matched. MySQL counts matched rows (FOUND_ROWS), so an update that
    leaves every value as it was still reports 1.
    """
    stmt = update(inst).where(inst.c.id == instance_id, inst.c.status == src.value)
    if attempt is not None:
        stmt = stmt.where(inst.c.attempt == attempt)
    if lease_until is not None:
        stmt = stmt.where(inst.c.lease_expires_at_ms == lease_until)
    result = await conn.execute(stmt.values(**values, updated_at_ms=db_now_ms()))
    return result.rowcount == 1


async def extend_lease(
    conn: AsyncConnection, instance_id: str, token: int, lease_length_ms: int
) -> bool:
    """Set the lease end to db-now + `lease_length_ms` while RUNNING at attempt `token`.

    A heartbeat is not a status change: `updated_at_ms` stays as the last change left it.
    """
    stmt = (
        update(inst)
        .where(
            inst.c.id == instance_id,
            inst.c.status == Status.RUNNING.value,
            inst.c.attempt == token,
        )
        .values(lease_expires_at_ms=db_now_ms() + lease_length_ms)
    )
    return (await conn.execute(stmt)).rowcount == 1


async def append_history(
    conn: AsyncConnection,
    instance_id: str,
    *,
    src: Status | None,
    dst: Status,
    owner: str | None,
    reason: str,
    note: str | None = None,
) -> None:
    """Append one history row, copying `attempt` and the time from the row just written.
    The `note` column is written only with a note: rows without one are written as before
    it existed."""
    fields = [
        inst.c.id,
        literal(None if src is None else src.value, String(STATUS_LEN)),
        literal(dst.value, String(STATUS_LEN)),
        inst.c.attempt,
        literal(owner, String(OWNER_LEN)),
        literal(codec.reason(reason), String()),
        inst.c.updated_at_ms,
    ]
    columns = ["instance_id", "from_status", "to_status", "attempt", "owner", "reason", "at_ms"]
    if note is not None:
        fields.append(literal(codec.note(note), String(NOTE_LEN)))
        columns.append("note")
    source = select(*fields).where(inst.c.id == instance_id)
    await conn.execute(insert(hist).from_select(columns, source))


async def move(
    conn: AsyncConnection,
    instance_id: str,
    src: Status,
    dst: Status,
    *,
    reason: str,
    attempt: int | None = None,
    owner: str | None = None,
    fail_class: FailClass | None = None,
    error: str | None = None,
    next_attempt_at_ms: int | None = None,
    lease_until: int | None = None,
    note: str | None = None,
) -> bool:
    """CAS `src` -> `dst` (at `attempt`, with the lease ending at `lease_until`, when given)
    with the columns of `status_values`, and its history row (with `note`); False, writing
    nothing, when the row was not so. FAILED -> PENDING (a manual requeue) also moves to
    attempt + 1, and resolves the instance's open review entry (by `owner`)."""
    values = status_values(dst, fail_class, error, next_attempt_at_ms)
    if src is Status.FAILED and dst is Status.PENDING:
        # A new life: every entry and run of the failed one is of an older attempt now, so
        # a leftover entry (its dead-lettering failed) is acked, not failed as poison again.
        values["attempt"] = inst.c.attempt + 1
    if not await cas_update(conn, instance_id, src, attempt, values, lease_until):
        return False
    await append_history(conn, instance_id, src=src, dst=dst, owner=owner, reason=reason, note=note)
    if src is Status.FAILED and dst is Status.PENDING:
        await resolve_reviews(conn, instance_id, owner)
    return True


async def insert_side_effects(
    conn: AsyncConnection, instance_id: str, token: int, keys: list[str]
) -> None:
    """Record idempotency keys as committed by this attempt. A key already recorded raises an
    IntegrityError, and the caller's transaction rolls back."""
    if not keys:
        return
    stmt = insert(side_effects).values(created_at_ms=db_now_ms())
    rows = [{"idempotency_key": k, "instance_id": instance_id, "attempt": token} for k in keys]
    await conn.execute(stmt, rows)


async def owner_at(conn: AsyncConnection, instance_id: str, attempt: int) -> str | None:
    """The lease owner while the row is at `attempt` (None otherwise or without one)."""
    stmt = select(inst.c.lease_owner).where(inst.c.id == instance_id, inst.c.attempt == attempt)
    value = (await conn.execute(stmt)).scalar_one_or_none()
    return None if value is None else str(value)


async def status_of(conn: AsyncConnection, instance_id: str) -> Status | None:
    """The current status, None when the row does not exist."""
    value = (
        await conn.execute(select(inst.c.status).where(inst.c.id == instance_id))
    ).scalar_one_or_none()
    return None if value is None else Status(value)


async def lease_of(conn: AsyncConnection, instance_id: str) -> tuple[int, int | None]:
    """(attempt, lease_expires_at_ms) of an existing row."""
    stmt = select(inst.c.attempt, inst.c.lease_expires_at_ms).where(inst.c.id == instance_id)
    row = (await conn.execute(stmt)).one()
    expires = None if row.lease_expires_at_ms is None else int(row.lease_expires_at_ms)
    return int(row.attempt), expires


async def get(conn: AsyncConnection, instance_id: str) -> InstanceRow | None:
    """One instance, None when it does not exist."""
    row = (
        (await conn.execute(select(inst).where(inst.c.id == instance_id))).mappings().one_or_none()
    )
    return None if row is None else codec.instance_row(row)


async def list_rows(
    conn: AsyncConnection, task_id: str | None, status: Status | None, limit: int
) -> list[InstanceRow]:
    """Instances oldest `scheduled_for_ms` first (then id), at most `limit`; `StoreCorrupt`
    naming the first that does not decode."""
    rows = (await conn.execute(_listing(task_id, status, limit))).mappings()
    return [codec.instance_row(r) for r in rows]


async def list_rows_or_unreadable(
    conn: AsyncConnection, task_id: str | None, status: Status | None, limit: int
) -> list[InstanceRow | UnreadableRow]:
    """`list_rows`, with a row that does not decode as an `UnreadableRow` in its place."""
    rows = (await conn.execute(_listing(task_id, status, limit))).mappings()
    return [codec.instance_or_unreadable(r) for r in rows]


def _listing(task_id: str | None, status: Status | None, limit: int) -> Select[Any]:
    stmt = select(inst).order_by(inst.c.scheduled_for_ms, inst.c.id).limit(max(limit, 0))
    if task_id is not None:
        stmt = stmt.where(inst.c.task_id == task_id)
    if status is not None:
        stmt = stmt.where(inst.c.status == status.value)
    return stmt


async def count_by_status(conn: AsyncConnection) -> StatusCounts:
    """Every status with its row count (0 when none), and each status no state has named
    with a row that holds it (a hand edit). Settled rows are counted from the `settled` index
    alone; in-flight rows (its NULL entries, where an unknown status falls) by their status."""
    done = select(inst.c.settled, func.count()).where(inst.c.settled.is_not(None))
    open_ = select(inst.c.status, func.count()).where(inst.c.settled.is_(None))
    stmt = union_all(done.group_by(inst.c.settled), open_.group_by(inst.c.status))
    counts = dict.fromkeys(Status, 0)
    unreadable: list[str] = []
    for status, count in (await conn.execute(stmt)).all():
        try:
            counts[Status(status)] = int(count)
        except ValueError:
            unreadable.append(await _unknown_status(conn, status, int(count)))
    return StatusCounts(counts, tuple(sorted(unreadable)))


async def _unknown_status(conn: AsyncConnection, status: object, count: int) -> str:
    """What `StoreCorrupt` says of the first row (by id) holding `status`, and how many do."""
    held = select(inst.c.id).where(inst.c.status == status).order_by(inst.c.id).limit(1)
    key = (await conn.execute(held)).scalar()
    named = codec.not_a_status(status, "status", "task_instances", key)
    return f"{named} ({count} row{'s' if count != 1 else ''})"


async def history(conn: AsyncConnection, instance_id: str) -> list[HistoryRow]:
    """An instance's status changes in the order they were committed."""
    return (await histories(conn, [instance_id])).get(instance_id, [])


async def histories(
    conn: AsyncConnection, instance_ids: Sequence[str]
) -> dict[str, list[HistoryRow]]:
    """`history` of each of `instance_ids` (one statement per `CHUNK` ids); an id without
    history rows is left out."""
    out: dict[str, list[HistoryRow]] = {}
    for ids in chunks(sorted(set(instance_ids))):
        stmt = select(hist).where(hist.c.instance_id.in_(ids)).order_by(hist.c.id)
        for r in (await conn.execute(stmt)).mappings().all():
            row = codec.history_row(r)
            out.setdefault(row.instance_id, []).append(row)
    return out
