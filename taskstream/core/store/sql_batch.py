"""The run's claim and lease writes, for one instance or many per transaction (finishes are in
`sql_finishes`).

Each function runs inside a write transaction the caller (`SqlStore`) owns and keeps the rules
of `sql_instances`: compare-and-set on (id, status, attempt), one history row per change copied
from the row just written, times from the database clock. For many instances:

- Rows are locked and read first (`sql_queries.lock_rows`) and the winners are decided in
  Python from that read, so a row some earlier transaction already moved (e.g. RUNNING for this
  same owner at the expected attempt + 1) is never taken for a win. The UPDATE still names
  (id, status, attempt) and must match exactly the winners, else `RowsMoved` rolls back.
- Locks are taken in sorted order, so two batches over the same rows wait for each other
  instead of deadlocking.
- Statements per chunk of `sql_chunks.CHUNK` ids: claims 2 + one per distinct lease length,
  leases 2; never one per row.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.errors import StoreCorrupt, StoreError
from taskstream.core.reasons import SEEN_ON_STREAM
from taskstream.core.states import Status
from taskstream.core.store import sql_chunks
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import Claim, Claimed, ClaimRequest, InstanceRow
from taskstream.core.store.records import utf8_size
from taskstream.core.store.sql_outbox import dispatch_rows
from taskstream.core.store.sql_prepared import Runner
from taskstream.core.store.tables import task_instances as inst

_BEFORE_DISPATCH = frozenset({Status.PENDING.value, Status.RETRYING.value})
"""Statuses whose row the outbox moves to DISPATCHED after its XADD."""
_DISPATCHED = frozenset({Status.DISPATCHED.value})


def plan_claims(requests: Sequence[ClaimRequest]) -> dict[str, list[tuple[int, int]]]:
    """instance id -> [(expected_attempt, lease length ms), ...] in request order.
    `ValueError` for a non-positive lease, before any SQL."""
    options: dict[str, list[tuple[int, int]]] = {}
    for r in requests:
        options.setdefault(r.instance_id, []).append((r.expected_attempt, rows.lease_ms(r.lease_s)))
    return options


# claims


async def claim_one(
    conn: AsyncConnection, instance_id: str, expected_attempt: int, owner: str, lease_length_ms: int
) -> Claim | None:
    """CAS DISPATCHED -> RUNNING at `expected_attempt`, attempt + 1, lease to `owner` until
    db-now + `lease_length_ms`, and its history row. None when the race was lost."""
    values, src = rows.claim_values(owner, lease_length_ms), Status.DISPATCHED
    if not await rows.cas_update(conn, instance_id, src, expected_attempt, values):
        return None
    await rows.append_history(
        conn, instance_id, src=src, dst=Status.RUNNING, owner=owner, reason="claimed"
    )
    token, expires = await rows.lease_of(conn, instance_id)
    if expires is None:
        raise StoreError(f"instance {instance_id!r} was claimed without a lease")
    return Claim(token=token, lease_expires_at_ms=expires)


def _expected(
    options: Mapping[str, list[tuple[int, int]]],
    locked: Mapping[str, Mapping[str, Any]],
    statuses: frozenset[str],
) -> Iterator[tuple[str, int, int]]:
    """(id, attempt, lease length ms) of each locked row at one of `statuses` whose attempt
    a request for it expects (the lease of the first such request, in request order)."""
    for instance_id, wanted in options.items():
        row = locked.get(instance_id)
        if row is None or row["status"] not in statuses:
            continue
        attempt = int(row["attempt"])
        lease = next((ms for expected, ms in wanted if expected == attempt), None)
        if lease is not None:
            yield instance_id, attempt, lease


def _claim_winners(
    options: Mapping[str, list[tuple[int, int]]], locked: Mapping[str, Mapping[str, Any]]
) -> dict[int, list[tuple[str, int]]]:
    """lease length ms -> [(id, attempt)] of the claims that win: the row is DISPATCHED and
    the first request for it (in request order) expects its attempt."""
    groups: dict[int, list[tuple[str, int]]] = {}
    for instance_id, attempt, lease in _expected(options, locked, _DISPATCHED):
        groups.setdefault(lease, []).append((instance_id, attempt))
    return groups


async def _complete_dispatch(
    run: Runner,
    options: Mapping[str, list[tuple[int, int]]],
    locked: dict[str, dict[str, Any]],
    now_ms: int,
) -> dict[str, dict[str, Any]]:
    """The outbox's last step, PENDING/RETRYING -> DISPATCHED (history reason
    `seen_on_stream`), for the locked rows a claim expects at their attempt: their entry
    was read, so its XADD happened, and only the outbox's CAS has not landed yet (it then
    loses, finding the row claimed). Done here, in the claim's transaction, such a row is
    claimed at once instead of being lost and read and claimed again. Returns `locked` with
    those rows DISPATCHED (the claim then sets every other column the move set)."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for instance_id, attempt, _ in _expected(options, locked, _BEFORE_DISPATCH):
        groups.setdefault(locked[instance_id]["status"], []).append((instance_id, attempt))
    moved = dict(locked)
    for src, pairs in sorted(groups.items()):
        await dispatch_rows(run, Status(src), pairs, reason=SEEN_ON_STREAM, at_ms=now_ms)
        for instance_id, _ in pairs:
            moved[instance_id] = {**locked[instance_id], "status": Status.DISPATCHED.value}
    return moved


def _readable(
    groups: Mapping[int, list[tuple[str, int]]], locked: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[int, list[tuple[str, int]]], dict[str, dict[str, Any]]]:
    """The winning claims (`_claim_winners`) whose locked row decodes, and each one's fields
    (`codec.instance_fields`). A row holding what taskstream never writes (`StoreCorrupt`)
    is left unclaimed and as it is, so that it does not take the others' claims down: the
    caller reads it as a lost claim and finds why."""
    kept: dict[int, list[tuple[str, int]]] = {}
    fields: dict[str, dict[str, Any]] = {}
    for lease_length_ms, pairs in groups.items():
        for instance_id, attempt in pairs:
            try:
                fields[instance_id] = codec.instance_fields(locked[instance_id])
            except StoreCorrupt:
                continue
            kept.setdefault(lease_length_ms, []).append((instance_id, attempt))
    return kept, fields


def _claimed(
    row: Mapping[str, Any], fields: dict[str, Any], owner: str, now_ms: int, lease_length_ms: int
) -> Claimed:
    """The locked row (decoded as `fields`) as the claim UPDATE (`sql_instances.claim_values`)
    leaves it."""
    expires = now_ms + lease_length_ms
    fields.update(
        status=Status.RUNNING,
        attempt=fields["attempt"] + 1,
        fail_class=None,
        next_attempt_at_ms=None,
        lease_owner=owner,
        lease_expires_at_ms=expires,
        updated_at_ms=now_ms,
    )
    after = InstanceRow(**fields)
    size = utf8_size(row["payload"])
    return Claimed(token=after.attempt, lease_expires_at_ms=expires, row=after, payload_bytes=size)


def _claim_columns(owner: str, now_ms: int, lease_length_ms: int) -> dict[str, Any]:
    """What a batch claim sets (as `sql_instances.claim_values`), with the times of the
    database clock read under the locks."""
    return rows.status_values(Status.RUNNING, None, None, None) | {
        "attempt": templates.NEXT,
        "lease_owner": owner,
        "lease_expires_at_ms": now_ms + lease_length_ms,
        "updated_at_ms": now_ms,
    }


async def claim_many(
    run: Runner, options: Mapping[str, list[tuple[int, int]]], owner: str
) -> dict[str, Claimed]:
    """Claim (DISPATCHED -> RUNNING, attempt + 1, lease from db-now) every instance of
    `options` (from `plan_claims`) whose attempt matches and whose row decodes; returns the
    won claims by id.

    The rows are read whole under their locks, with the database clock, so the claimed rows
    are known without reading them back."""
    claimed: dict[str, Claimed] = {}
    for ids in sql_chunks.chunks(sorted(options)):
        now_ms, locked = await q.lock_rows(run, ids)
        locked = await _complete_dispatch(run, options, locked, now_ms)
        groups, fields = _readable(_claim_winners(options, locked), locked)
        for lease_length_ms, pairs in sorted(groups.items()):
            values = _claim_columns(owner, now_ms, lease_length_ms)
            await q.cas_update(run, Status.DISPATCHED, pairs, [values] * len(pairs), "claim batch")
            for i, _ in pairs:
                claimed[i] = _claimed(locked[i], fields[i], owner, now_ms, lease_length_ms)
        won = sorted(i for pairs in groups.values() for i, _ in pairs)
        if won:
            await q.append_history(
                run,
                won,
                src=Status.DISPATCHED,
                owners=dict.fromkeys(won, owner),
                reasons=dict.fromkeys(won, "claimed"),
            )
    return claimed


# leases


async def extend_leases(
    conn: AsyncConnection, held: Sequence[tuple[str, int]], lease_length_ms: int
) -> set[tuple[str, int]]:
    """Set the lease end to db-now + `lease_length_ms` for each (id, token) still RUNNING at
    that attempt; returns those pairs. Like `sql_instances.extend_lease`, not a status change:
    `updated_at_ms` and history are left alone."""
    still: set[tuple[str, int]] = set()
    for pairs in sql_chunks.chunks(sorted(set(held))):
        locked = (
            select(inst.c.id, inst.c.attempt)
            .where(inst.c.status == Status.RUNNING.value, q.match_pairs(pairs))
            .order_by(inst.c.id)
            .with_for_update()
        )
        found = [(str(i), int(a)) for i, a in (await conn.execute(locked)).all()]
        if not found:
            continue
        stmt = (
            update(inst)
            .where(inst.c.status == Status.RUNNING.value, q.match_pairs(found))
            .values(lease_expires_at_ms=db_now_ms() + lease_length_ms)
        )
        await q.update_exactly(conn, stmt, len(found), "lease batch")
        still.update(found)
    return still
