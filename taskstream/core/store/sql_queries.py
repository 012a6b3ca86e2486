"""Set-at-a-time statements: the building blocks of the batch writes (`sql_batch`,
`sql_finishes`), the work-finding reads (the poisoned rows `dead list` looks through among
them), and the review queue.

Each function runs inside a transaction the caller owns. Batch statements address rows by id
(through the primary key) and carry per-row values as `CASE id WHEN ... END`, so their count
does not grow with the number of rows. Lists come oldest first (ties broken by id) so that
loops working a backlog never starve its oldest rows; the poisoned rows, which operators read,
newest first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Update, and_, case, func, insert, literal, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from taskstream.core.errors import StoreError
from taskstream.core.states import IN_FLIGHT, FailClass, Status
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import InstanceRow, UnreadableRow
from taskstream.core.store.sql_chunks import chunks
from taskstream.core.store.sql_prepared import Runner
from taskstream.core.store.tables import instance_history as hist
from taskstream.core.store.tables import review_queue, side_effects
from taskstream.core.store.tables import task_instances as inst


class RowsMoved(StoreError):
    """A batch CAS UPDATE matched fewer rows than it named: some row is no longer at the
    status and attempt the batch expected. The caller's transaction rolls back."""


class Seen(NamedTuple):
    """A row's state as read under its lock."""

    status: Status
    attempt: int
    lease_owner: str | None


def match_pairs(pairs: Sequence[tuple[str, int]]) -> ColumnElement[bool]:
    """Rows whose (id, attempt) is one of `pairs`. When all pairs share one attempt (the
    common case: a batch of fresh runs) `attempt = a AND id IN (...)`, else a row-value IN;
    either is one cached statement whatever the batch size (an OR of ANDs is rebuilt and
    re-keyed for every batch)."""
    # The plain IN on id lets every planner find the rows through the primary key.
    ids = inst.c.id.in_([i for i, _ in pairs])
    attempts = {a for _, a in pairs}
    if len(attempts) == 1:
        return and_(ids, inst.c.attempt == attempts.pop())
    return and_(ids, tuple_(inst.c.id, inst.c.attempt).in_(list(pairs)))


def per_id(
    by_id: Mapping[str, Any], type_: TypeEngine[Any], else_: ColumnElement[Any] | None = None
) -> ColumnElement[Any]:
    """One value per instance id as SQL: a literal when all agree, else `CASE id WHEN ...`."""
    distinct = set(by_id.values())
    if len(distinct) == 1 and else_ is None:
        return literal(distinct.pop(), type_)
    whens = {i: literal(v, type_) for i, v in by_id.items()}
    return case(whens, value=inst.c.id, else_=else_)


async def append_history(
    run: Runner,
    ids: Sequence[str],
    *,
    src: Status | None,
    owners: Mapping[str, str | None],
    reasons: Mapping[str, str],
) -> None:
    """One history row per id, copying dst, attempt and time from the row just written
    (`src` None: the row was just created)."""
    await run.count(*templates.bind_history(ids, src, owners, reasons))


async def cas_update(
    run: Runner,
    src: Status,
    pairs: Sequence[tuple[str, int]],
    values: Sequence[Mapping[str, Any]],
    what: str,
) -> None:
    """The CAS UPDATE of the rows `pairs` (id, attempt) at `src`, row k set to `values[k]`
    (see `sql_templates.bind_update`); it must match every row, else `RowsMoved` (the
    caller's transaction then rolls back)."""
    matched = await run.count(*templates.bind_update(src, pairs, values))
    if matched != len(pairs):
        raise RowsMoved(f"{what}: {matched} rows matched, {len(pairs)} expected")


async def update_exactly(conn: AsyncConnection, stmt: Update, expected: int, what: str) -> None:
    """Run a CAS UPDATE that must match exactly `expected` rows (those this transaction
    locked, or all those it names); `RowsMoved` (the caller's transaction then rolls back)
    otherwise."""
    matched = (await conn.execute(stmt)).rowcount
    if matched != expected:
        raise RowsMoved(f"{what}: {matched} rows matched, {expected} expected")


async def lock_states(run: Runner, ids: Sequence[str]) -> dict[str, Seen]:
    """Lock the rows of `ids`, at most `CHUNK` (in id order, so concurrent batches queue
    instead of deadlocking) and read their state; missing ids are absent. SQLite ignores FOR
    UPDATE: its writers already hold the file lock from BEGIN IMMEDIATE. Through a `Runner`,
    so on the driver path too (`CoreRunner` on an engine connection)."""
    found = await run.rows(*templates.bind_lock_states(ids))
    return {
        str(m["id"]): Seen(Status(m["status"]), int(m["attempt"]), m["lease_owner"]) for m in found
    }


async def lock_rows(run: Runner, ids: Sequence[str]) -> tuple[int, dict[str, dict[str, Any]]]:
    """Like `lock_states`, but whole rows (undecoded: `codec.instance_fields` decodes the ones
    the caller keeps), and the database clock (epoch ms) read in the same statement (0 when no
    row was found: there is nothing to time)."""
    found = await run.rows(*templates.bind_lock(ids))
    if not found:
        return 0, {}
    return int(found[0]["db_now_ms"]), {str(m["id"]): m for m in found}


async def recorded_keys(conn: AsyncConnection, keys: Sequence[str]) -> set[str]:
    """The side-effect keys among `keys` that are already recorded."""
    found: set[str] = set()
    for part in chunks(keys):
        key = side_effects.c.idempotency_key
        found.update(
            str(k) for k in (await conn.execute(select(key).where(key.in_(part)))).scalars()
        )
    return found


async def due_retries(
    conn: AsyncConnection, now_ms: int, limit: int, after: tuple[int, str] | None = None
) -> list[InstanceRow | UnreadableRow]:
    """RETRYING rows with `next_attempt_at_ms <= now_ms`, earliest due first (then id), at most
    `limit`; only those past `after` ((next_attempt_at_ms, id)) when given, so a caller can
    page past rows it cannot move; one that does not decode as an `UnreadableRow` in its
    place. Served by the (settled, next_attempt_at_ms) index."""
    stmt = (
        select(inst)
        .where(
            inst.c.settled.is_(None),
            inst.c.next_attempt_at_ms <= now_ms,
            inst.c.status == Status.RETRYING.value,
        )
        .order_by(inst.c.next_attempt_at_ms, inst.c.id)
        .limit(max(limit, 0))
    )
    if after is not None:
        stmt = stmt.where(_past(inst.c.next_attempt_at_ms, after))
    return [codec.instance_or_unreadable(m) for m in (await conn.execute(stmt)).mappings()]


def _past(ms: ColumnElement[Any], after: tuple[int, str]) -> ColumnElement[bool]:
    """Rows past `after` ((`ms`, id)) in the order (`ms`, id): where a page read by that
    order left off."""
    at_ms, instance_id = after
    return or_(ms > at_ms, and_(ms == at_ms, inst.c.id > instance_id))


async def stale(
    conn: AsyncConnection,
    statuses: Sequence[Status],
    updated_before_ms: int,
    limit: int,
    after: tuple[int, str] | None = None,
) -> list[InstanceRow | UnreadableRow]:
    """Rows in `statuses` whose `updated_at_ms < updated_before_ms`, least recently updated
    first (then id), at most `limit`; only those past `after` ((updated_at_ms, id)) when
    given, so a caller can page through all of them; one that does not decode as an
    `UnreadableRow` in its place. In-flight statuses are found through the `settled` index
    (`settled IS NULL`)."""
    if not statuses:
        return []
    wanted: ColumnElement[bool] = inst.c.status.in_([s.value for s in statuses])
    if set(statuses) <= set(IN_FLIGHT):
        wanted = and_(inst.c.settled.is_(None), wanted)
    stmt = (
        select(inst)
        .where(wanted, inst.c.updated_at_ms < updated_before_ms)
        .order_by(inst.c.updated_at_ms, inst.c.id)
        .limit(max(limit, 0))
    )
    if after is not None:
        stmt = stmt.where(_past(inst.c.updated_at_ms, after))
    return [codec.instance_or_unreadable(m) for m in (await conn.execute(stmt)).mappings()]


async def poisoned(
    conn: AsyncConnection, limit: int, before: tuple[int, str] | None = None
) -> list[InstanceRow | UnreadableRow]:
    """Rows FAILED `poison`, the latest failure first (`updated_at_ms`, then id, both
    descending), at most `limit`; only those before `before` ((updated_at_ms, id)) when
    given. The `fail_class` index narrows the read to the rows FAILED `poison` (the column
    is NULL on every other row), which are then sorted."""
    stmt = (
        select(inst)
        .where(
            inst.c.settled == Status.FAILED.value,
            inst.c.fail_class == FailClass.POISON.value,
        )
        .order_by(inst.c.updated_at_ms.desc(), inst.c.id.desc())
        .limit(max(limit, 0))
    )
    if before is not None:
        at_ms, instance_id = before
        ms = inst.c.updated_at_ms
        stmt = stmt.where(or_(ms < at_ms, and_(ms == at_ms, inst.c.id < instance_id)))
    return [codec.instance_or_unreadable(m) for m in (await conn.execute(stmt)).mappings()]


async def side_effect_done(conn: AsyncConnection, key: str) -> bool:
    """True when `key` is recorded in `side_effects` (by a committed finish)."""
    stmt = select(side_effects.c.idempotency_key).where(side_effects.c.idempotency_key == key)
    return (await conn.execute(stmt)).first() is not None


async def count_history(conn: AsyncConnection, instance_id: str, reason: str) -> int:
    """History rows of `instance_id` whose reason is `reason` (compared as stored: cut to the
    column's width)."""
    stmt = (
        select(func.count())
        .select_from(hist)
        .where(hist.c.instance_id == instance_id, hist.c.reason == codec.reason(reason))
    )
    return int((await conn.execute(stmt)).scalar_one())


async def add_review(conn: AsyncConnection, instance_id: str, reason: str) -> bool:
    """Queue `instance_id` for review unless it has an unresolved entry already; True when a
    row was added. An unknown instance is not queued.

    The instance row is locked first, so two concurrent adds for one instance run one after
    the other and the second sees the first's entry.
    """
    lock = select(inst.c.id).where(inst.c.id == instance_id).with_for_update()
    if (await conn.execute(lock)).first() is None:
        return False
    open_entry = select(review_queue.c.id).where(
        review_queue.c.instance_id == instance_id, review_queue.c.resolved_at_ms.is_(None)
    )
    if (await conn.execute(open_entry.limit(1))).first() is not None:
        return False
    await conn.execute(
        insert(review_queue).values(
            instance_id=instance_id, reason=codec.reason(reason), created_at_ms=db_now_ms()
        )
    )
    return True


async def resolve_reviews(conn: AsyncConnection, instance_id: str, who: str | None) -> None:
    """Mark the instance's open review entry resolved now, by `who`: an operator requeued
    it, which answers the review, and a review its new life asks for is queued anew."""
    stmt = (
        update(review_queue)
        .where(review_queue.c.instance_id == instance_id, review_queue.c.resolved_at_ms.is_(None))
        .values(resolved_at_ms=db_now_ms(), resolved_by=who)
    )
    await conn.execute(stmt)
