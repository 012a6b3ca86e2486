"""The run's status writes: claim, lease, finish, for one instance or many per transaction.

Each function runs inside a write transaction the caller (`SqlStore`) owns and keeps the rules
of `sql_instances`: compare-and-set on (id, status, attempt), one history row per change copied
from the row just written, times from the database clock. For many instances:

- Rows are locked and read first (`sql_queries.lock_states`) and the winners are decided in
  Python from that read, so a row some earlier transaction already moved (e.g. RUNNING for this
  same owner at the expected attempt + 1) is never taken for a win. The UPDATE still names
  (id, status, attempt) and must match exactly the winners, else `StoreError` rolls back.
- Locks, and side-effect keys, are taken in sorted order, so two batches over the same rows
  wait for each other instead of deadlocking.
- Statements per chunk of `sql_queries.CHUNK` ids (and keys): claims 2 + one per distinct
  lease length, leases 2, finishes at most 5 (lock, key check, update, history, side effects);
  never one per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.errors import StoreError
from taskstream.core.states import Status, check_transition
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import (
    CasResult,
    Claim,
    Claimed,
    ClaimRequest,
    FinishRequest,
    InstanceRow,
)
from taskstream.core.store.tables import side_effects
from taskstream.core.store.tables import task_instances as inst


@dataclass(frozen=True, slots=True)
class PreparedFinish:
    """A checked `FinishRequest`: the columns its CAS sets and its distinct side-effect keys
    (first occurrence order)."""

    request: FinishRequest
    values: dict[str, Any]
    keys: tuple[str, ...]


def plan_claims(requests: Sequence[ClaimRequest]) -> dict[str, list[tuple[int, int]]]:
    """instance id -> [(expected_attempt, lease length ms), ...] in request order.
    `ValueError` for a non-positive lease, before any SQL."""
    options: dict[str, list[tuple[int, int]]] = {}
    for r in requests:
        options.setdefault(r.instance_id, []).append((r.expected_attempt, rows.lease_ms(r.lease_s)))
    return options


def prepare_finish(request: FinishRequest) -> PreparedFinish:
    """Check RUNNING -> dst (`InvalidTransition`) and encode the result (`StoreError` when it
    is not JSON), before any SQL."""
    check_transition(Status.RUNNING, request.dst, fail_class=request.fail_class)
    values = rows.status_values(
        request.dst, request.fail_class, request.error, request.next_attempt_at_ms
    )
    result = request.result
    values["result"] = None if result is None else codec.dumps(result, what="result")
    return PreparedFinish(request, values, tuple(dict.fromkeys(request.side_effects)))


def prepare_finishes(requests: Sequence[FinishRequest]) -> list[PreparedFinish]:
    """`prepare_finish` for each request; `ValueError` when an instance appears twice (one
    batch commits at most one run per instance)."""
    ids = [r.instance_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("finish_many: each instance may appear only once per batch")
    return [prepare_finish(r) for r in requests]


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


def _claim_winners(
    options: Mapping[str, list[tuple[int, int]]], locked: Mapping[str, InstanceRow]
) -> dict[int, list[tuple[str, int]]]:
    """lease length ms -> [(id, attempt)] of the claims that win: the row is DISPATCHED and
    the first request for it (in request order) expects its attempt."""
    groups: dict[int, list[tuple[str, int]]] = {}
    for instance_id, wanted in options.items():
        row = locked.get(instance_id)
        if row is None or row.status is not Status.DISPATCHED:
            continue
        lease = next((ms for attempt, ms in wanted if attempt == row.attempt), None)
        if lease is not None:
            groups.setdefault(lease, []).append((instance_id, row.attempt))
    return groups


def _claimed(row: InstanceRow, owner: str, now_ms: int, lease_length_ms: int) -> Claimed:
    """The row as the claim UPDATE (`sql_instances.claim_values`) leaves it."""
    expires = now_ms + lease_length_ms
    after = replace(
        row,
        status=Status.RUNNING,
        attempt=row.attempt + 1,
        fail_class=None,
        next_attempt_at_ms=None,
        lease_owner=owner,
        lease_expires_at_ms=expires,
        updated_at_ms=now_ms,
    )
    return Claimed(token=after.attempt, lease_expires_at_ms=expires, row=after)


async def claim_many(
    conn: AsyncConnection, options: Mapping[str, list[tuple[int, int]]], owner: str
) -> dict[str, Claimed]:
    """Claim (DISPATCHED -> RUNNING, attempt + 1, lease from db-now) every instance of
    `options` (from `plan_claims`) whose attempt matches; returns the won claims by id.

    The rows are read whole under their locks, with the database clock, so the claimed rows
    are known without reading them back."""
    claimed: dict[str, Claimed] = {}
    for ids in q.chunks(sorted(options)):
        now_ms, locked = await q.lock_rows(conn, ids)
        groups = _claim_winners(options, locked)
        for lease_length_ms, pairs in sorted(groups.items()):
            values = rows.claim_values(owner, lease_length_ms)
            values |= {"lease_expires_at_ms": now_ms + lease_length_ms, "updated_at_ms": now_ms}
            stmt = (
                update(inst)
                .where(inst.c.status == Status.DISPATCHED.value, q.match_pairs(pairs))
                .values(**values)
            )
            await q.update_exactly(conn, stmt, len(pairs), "claim batch")
            for instance_id, _ in pairs:
                claimed[instance_id] = _claimed(locked[instance_id], owner, now_ms, lease_length_ms)
        won = sorted(i for pairs in groups.values() for i, _ in pairs)
        if won:
            await q.append_history(
                conn,
                won,
                src=Status.DISPATCHED,
                owners=dict.fromkeys(won, owner),
                reasons=dict.fromkeys(won, "claimed"),
            )
    return claimed


# leases


async def extend_leases(
    conn: AsyncConnection, held: Sequence[tuple[str, int]], lease_length_ms: int
) -> set[str]:
    """Set the lease end to db-now + `lease_length_ms` for each (id, token) still RUNNING at
    that attempt; returns those ids. Like `sql_instances.extend_lease`, not a status change:
    `updated_at_ms` and history are left alone."""
    still: set[str] = set()
    for pairs in q.chunks(sorted(set(held))):
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
        still.update(i for i, _ in found)
    return still


# finishes


async def finish_one(conn: AsyncConnection, prepared: PreparedFinish) -> CasResult:
    """The single-run finish: CAS RUNNING -> dst at attempt == token, its history row and its
    side-effect keys. A key already recorded raises an IntegrityError (the caller rolls back)."""
    r, src = prepared.request, Status.RUNNING
    # Owner changes only with the attempt, so if the CAS below wins this is its owner.
    owner = await rows.owner_at(conn, r.instance_id, r.token)
    if not await rows.cas_update(conn, r.instance_id, src, r.token, prepared.values):
        return CasResult(ok=False, found=await rows.status_of(conn, r.instance_id))
    await rows.append_history(conn, r.instance_id, src=src, dst=r.dst, owner=owner, reason=r.reason)
    await rows.insert_side_effects(conn, r.instance_id, r.token, list(prepared.keys))
    return CasResult(ok=True)


def _decide_finishes(
    prepared: Sequence[PreparedFinish], seen: Mapping[str, q.Seen], taken: set[str]
) -> tuple[dict[str, CasResult], list[PreparedFinish]]:
    """Results in request order, as sequential `finish` calls would give them: a run wins when
    its row is RUNNING at its token and none of its keys is in `taken` (recorded before, or by
    an earlier winner of this batch)."""
    results: dict[str, CasResult] = {}
    winners: list[PreparedFinish] = []
    for p in prepared:
        r = p.request
        state = seen.get(r.instance_id)
        if state is None or state.status is not Status.RUNNING or state.attempt != r.token:
            results[r.instance_id] = CasResult(
                ok=False, found=None if state is None else state.status
            )
        elif taken.intersection(p.keys):
            results[r.instance_id] = CasResult(ok=False, found=Status.RUNNING)
        else:
            taken.update(p.keys)
            winners.append(p)
            results[r.instance_id] = CasResult(ok=True)
    return results, winners


async def _finish_chunk(
    conn: AsyncConnection, winners: Sequence[PreparedFinish], owners: Mapping[str, str | None]
) -> None:
    """One CAS UPDATE RUNNING -> dst at each run's token (all must match, else
    `q.RowsMoved`), and the history rows naming `owners`."""
    by_id = {p.request.instance_id: p.values for p in winners}
    values: dict[str, Any] = {}
    for name in sorted({c for v in by_id.values() for c in v}):
        per_row = {i: v[name] for i, v in by_id.items() if name in v}
        # Rows without a value for the column (e.g. no error given) keep their own.
        keep = None if len(per_row) == len(by_id) else inst.c[name]
        values[name] = q.per_id(per_row, inst.c[name].type, keep)
    pairs = [(p.request.instance_id, p.request.token) for p in winners]
    stmt = (
        update(inst)
        .where(inst.c.status == Status.RUNNING.value, q.match_pairs(pairs))
        .values(**values, updated_at_ms=db_now_ms())
    )
    await q.update_exactly(conn, stmt, len(pairs), "finish batch")
    await q.append_history(
        conn,
        sorted(by_id),
        src=Status.RUNNING,
        owners={i: owners[i] for i in by_id},
        reasons={p.request.instance_id: p.request.reason for p in winners},
    )


def unread_ok(prepared: Sequence[PreparedFinish]) -> bool:
    """The batch may be written by `finish_unread`: every run names its owner and records no
    side effects (a key check would need a read anyway)."""
    return all(p.request.owner is not None and not p.keys for p in prepared)


async def finish_unread(
    conn: AsyncConnection, prepared: Sequence[PreparedFinish]
) -> dict[str, CasResult]:
    """`finish_many` for a batch that passes `unread_ok`, without reading the rows first:
    each chunk's CAS UPDATE must match every run (it locks their rows in id order), else
    `q.RowsMoved` and the caller's transaction rolls back."""
    for part in q.chunks(sorted(prepared, key=lambda p: p.request.instance_id)):
        await _finish_chunk(conn, part, {p.request.instance_id: p.request.owner for p in part})
    return {p.request.instance_id: CasResult(ok=True) for p in prepared}


async def finish_many(
    conn: AsyncConnection, prepared: Sequence[PreparedFinish]
) -> dict[str, CasResult]:
    """Commit every run of `prepared` (from `prepare_finishes`) that still holds its row and
    whose keys are free; the others change nothing. Results are in request order. A key taken
    concurrently after the pre-check raises an IntegrityError and the whole batch rolls back."""
    seen: dict[str, q.Seen] = {}
    for ids in q.chunks(sorted(p.request.instance_id for p in prepared)):
        seen |= await q.lock_states(conn, ids)
    keys = sorted({k for p in prepared if p.request.instance_id in seen for k in p.keys})
    results, winners = _decide_finishes(prepared, seen, await q.recorded_keys(conn, keys))
    owners = {i: s.lease_owner for i, s in seen.items()}
    for part in q.chunks(sorted(winners, key=lambda p: p.request.instance_id)):
        await _finish_chunk(conn, part, owners)
    effects = sorted((k, p.request.instance_id, p.request.token) for p in winners for k in p.keys)
    for rows_part in q.chunks(effects):
        stmt = insert(side_effects).values(
            [
                {"idempotency_key": k, "instance_id": i, "attempt": a, "created_at_ms": db_now_ms()}
                for k, i, a in rows_part
            ]
        )
        await conn.execute(stmt)
    return results
