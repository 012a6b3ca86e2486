"""The run's finish writes: the final CAS of one run or of many per transaction.

Each function runs inside a write transaction the caller (`SqlStore`) owns and keeps the rules
of `sql_instances`: compare-and-set RUNNING -> dst on (id, attempt == token), one history row
per change copied from the row just written, the run's side-effect keys recorded with it,
times from the database clock. For many runs:

- `finish_many` locks and reads the rows first (`sql_queries.lock_states`) and decides the
  winners in Python, as sequential finishes would; side-effect keys are checked and inserted
  in sorted order. Statements per chunk: at most 5 (lock, key check, update, history, side
  effects); never one per row, but for the review entries a run may ask for (`review`,
  rare), which are queued in the same transaction.
- `finish_unread` serves the common batch (every run names its owner, no side effects) with 2
  statements per chunk (update, history), and `RowsMoved` when some run no longer holds its
  row; the caller then rolls back and takes `finish_many`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.states import Status, check_transition
from taskstream.core.store import sql_chunks
from taskstream.core.store import sql_codec as codec
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import CasResult, FinishRequest
from taskstream.core.store.sql_prepared import CoreRunner, Runner
from taskstream.core.store.tables import side_effects


@dataclass(frozen=True, slots=True)
class PreparedFinish:
    """A checked `FinishRequest`: the columns its CAS sets and its distinct side-effect keys
    (first occurrence order)."""

    request: FinishRequest
    values: dict[str, Any]
    keys: tuple[str, ...]


def prepare_finish(request: FinishRequest) -> PreparedFinish:
    """Check RUNNING -> dst (`InvalidTransition`) and encode the result (`StoreError` when it
    is not JSON), before any SQL."""
    check_transition(Status.RUNNING, request.dst, fail_class=request.fail_class)
    values = rows.status_values(
        request.dst, request.fail_class, request.error, request.next_attempt_at_ms
    )
    result, text = request.result, request.result_json
    if text is None and result is not None:
        text = codec.dumps(result, what="result")
    values["result"] = text
    return PreparedFinish(request, values, tuple(dict.fromkeys(request.side_effects)))


def prepare_finishes(requests: Sequence[FinishRequest]) -> list[PreparedFinish]:
    """`prepare_finish` for each request; `ValueError` when an instance appears twice (one
    batch commits at most one run per instance)."""
    ids = [r.instance_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("finish_many: each instance may appear only once per batch")
    return [prepare_finish(r) for r in requests]


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
    await _queue_reviews(conn, [prepared])
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
    run: Runner, winners: Sequence[PreparedFinish], owners: Mapping[str, str | None]
) -> None:
    """One CAS UPDATE RUNNING -> dst at each run's token (all must match, else
    `q.RowsMoved`), and the history rows naming `owners`."""
    pairs = [(p.request.instance_id, p.request.token) for p in winners]
    values = [p.values | {"updated_at_ms": templates.NOW} for p in winners]
    await q.cas_update(run, Status.RUNNING, pairs, values, "finish batch")
    await q.append_history(
        run,
        sorted(i for i, _ in pairs),
        src=Status.RUNNING,
        owners={i: owners[i] for i, _ in pairs},
        reasons={p.request.instance_id: p.request.reason for p in winners},
    )


def _update_chunks(prepared: Sequence[PreparedFinish]) -> Iterator[Sequence[PreparedFinish]]:
    """`prepared` in id order (the order rows are locked in), in slices that each make one
    CAS UPDATE of at most `sql_chunks.STATEMENT_BYTES`: results can be large."""
    ordered = sorted(prepared, key=lambda p: p.request.instance_id)
    return sql_chunks.sized_chunks(ordered, [sql_chunks.row_size(p.values) for p in ordered])


def unread_ok(prepared: Sequence[PreparedFinish]) -> bool:
    """The batch may be written by `finish_unread`: every run names its owner and records no
    side effects (a key check would need a read anyway) and no review."""
    return all(
        p.request.owner is not None and not p.keys and p.request.review is None for p in prepared
    )


async def _queue_reviews(conn: AsyncConnection, winners: Sequence[PreparedFinish]) -> None:
    """The review entries the winners ask for (rare: `manual_review` failures), in id order."""
    for p in sorted(winners, key=lambda p: p.request.instance_id):
        if p.request.review is not None:
            await q.add_review(conn, p.request.instance_id, p.request.review)


async def finish_unread(run: Runner, prepared: Sequence[PreparedFinish]) -> dict[str, CasResult]:
    """`finish_many` for a batch that passes `unread_ok`, without reading the rows first:
    each chunk's CAS UPDATE must match every run (it locks their rows in id order), else
    `q.RowsMoved` and the caller's transaction rolls back."""
    for part in _update_chunks(prepared):
        await _finish_chunk(run, part, {p.request.instance_id: p.request.owner for p in part})
    return {p.request.instance_id: CasResult(ok=True) for p in prepared}


async def finish_many(
    conn: AsyncConnection, prepared: Sequence[PreparedFinish]
) -> dict[str, CasResult]:
    """Commit every run of `prepared` (from `prepare_finishes`) that still holds its row and
    whose keys are free; the others change nothing. Results are in request order. A key taken
    concurrently after the pre-check raises an IntegrityError and the whole batch rolls back."""
    seen: dict[str, q.Seen] = {}
    for ids in sql_chunks.chunks(sorted(p.request.instance_id for p in prepared)):
        seen |= await q.lock_states(CoreRunner(conn), ids)
    keys = sorted({k for p in prepared if p.request.instance_id in seen for k in p.keys})
    results, winners = _decide_finishes(prepared, seen, await q.recorded_keys(conn, keys))
    owners = {i: s.lease_owner for i, s in seen.items()}
    for part in _update_chunks(winners):
        await _finish_chunk(CoreRunner(conn), part, owners)
    effects = sorted((k, p.request.instance_id, p.request.token) for p in winners for k in p.keys)
    stmt = insert(side_effects).values(created_at_ms=db_now_ms())
    for rows_part in sql_chunks.chunks(effects):
        params = [{"idempotency_key": k, "instance_id": i, "attempt": a} for k, i, a in rows_part]
        await conn.execute(stmt, params)
    await _queue_reviews(conn, winners)
    return results
