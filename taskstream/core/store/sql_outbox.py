"""The outbox's writes (DESIGN.md §6.1): create PENDING instances, then move them to DISPATCHED
once their entries are on a stream, one instance or many per transaction.

Batches keep the single-row rules: the UNIQUE dedupe key decides duplicates (checked first,
so a duplicate does not abort its batch; a concurrent insert that slips in after the check
rolls the batch back and each instance is then created on its own), every change has its
history row copied from the row just written, and the DISPATCHED step is a compare-and-set on
(id, status, attempt) over rows locked in id order. The DISPATCHED step first updates without
reading (the rows are almost always where the outbox left them); when an UPDATE matches none of
the rows it names (an executor that read their entries first moved them on), they are read
under lock for the statuses found, in the same transaction; when it matches some but not all,
that transaction rolls back and the rows are read under lock to decide each one. Both paths
send their statements on the driver when the store has one (`SqlStore._hot`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from functools import partial

from sqlalchemy.ext.asyncio import AsyncConnection

from taskstream.core.errors import StoreError
from taskstream.core.states import Status, check_transition
from taskstream.core.store import sql_chunks
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.port import CasResult, CreateResult, DispatchRequest, NewInstance
from taskstream.core.store.sql_conflicts import conflicts_retried
from taskstream.core.store.sql_definitions import newer_held
from taskstream.core.store.sql_errors import ConstraintViolation
from taskstream.core.store.sql_prepared import CoreRunner, Runner

_CREATE_TRIES = 3
PUBLISHED = "published"


class OutboxMethods:
    """Mixed into `SqlStore`; relies on its `_read` / `_write` / `_hot` transaction
    helpers."""

    _dispatch_found_moved = False
    """The last `dispatch_many` (of any caller of this store) found some row moved on (an
    executor claimed it first): the next one locks and reads first rather than try an update
    that would fail again. Only a guess at the cheaper path: both paths decide every row
    alike."""

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    def _write(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    def _hot(self) -> AbstractAsyncContextManager[Runner]:
        raise NotImplementedError

    async def create_instance(
        self, new: NewInstance, *, skipped: str | None = None, token: int | None = None
    ) -> CreateResult:
        """Insert a PENDING row and its first history row; with `skipped` (a reason) also move
        it to SKIPPED, in the same transaction. When the dedupe key (or id) is taken, nothing
        is written and the existing row's id is returned with created=False. Safe under
        concurrent inserts: the UNIQUE index decides, each try is a fresh transaction. With a
        leader `token`, nothing is written when the task holds a newer one (`fenced`)."""
        return await conflicts_retried(partial(self._create_instance, new, skipped, token))

    async def _create_instance(
        self, new: NewInstance, skipped: str | None, token: int | None
    ) -> CreateResult:
        last: ConstraintViolation | None = None
        for _ in range(_CREATE_TRIES):
            try:
                async with self._write() as conn:
                    if token is not None and await _fenced(CoreRunner(conn), [new], [token]):
                        return CreateResult(created=False, instance_id=new.id, fenced=True)
                    await rows.insert_instance(conn, new)
                    await rows.append_history(
                        conn,
                        new.id,
                        src=None,
                        dst=Status.PENDING,
                        owner=new.created_by,
                        reason=new.reason,
                    )
                    if skipped is not None:
                        await _skip(conn, new.id, skipped)
                return CreateResult(created=True, instance_id=new.id)
            except ConstraintViolation as exc:
                last = exc
            async with self._read() as conn:
                existing = await rows.existing_id(conn, new)
            if existing is not None:
                return CreateResult(created=False, instance_id=existing)
        raise StoreError(f"instance {new.id!r} could not be inserted: {last}") from last

    async def create_instances(
        self, news: Sequence[NewInstance], *, tokens: Sequence[int | None] | None = None
    ) -> list[CreateResult]:
        """`create_instance` for many, in request order, in one transaction when no concurrent
        writer takes one of the keys between the check and the insert (else one by one).
        `tokens[i]`: the leader token of `news[i]`'s creator, or None (see the port)."""
        if not news:
            return []
        fences: list[int | None] = list(tokens) if tokens is not None else [None] * len(news)
        if len(fences) != len(news):
            raise ValueError("create_instances: one token (or None) per instance")
        return await conflicts_retried(partial(self._create_instances, news, fences))

    async def _create_instances(
        self, news: Sequence[NewInstance], fences: list[int | None]
    ) -> list[CreateResult]:
        try:
            async with self._hot() as run:
                return await create_many(run, news, fences)
        except ConstraintViolation:
            return [
                await self.create_instance(new, token=token)
                for new, token in zip(news, fences, strict=True)
            ]

    async def dispatch_many(self, requests: Sequence[DispatchRequest]) -> dict[str, CasResult]:
        """CAS each row `src` -> DISPATCHED at its attempt, in one transaction (see the port)."""
        for r in requests:
            check_transition(r.src, Status.DISPATCHED)
        if len({r.instance_id for r in requests}) != len(requests):
            raise ValueError("dispatch_many: an instance is named twice")
        if not requests:
            return {}
        return await conflicts_retried(partial(self._dispatch_many, requests))

    async def _dispatch_many(self, requests: Sequence[DispatchRequest]) -> dict[str, CasResult]:
        results = None
        if len({r.src for r in requests}) == 1 and not self._dispatch_found_moved:
            # Usually every row is still where the outbox left it: update without reading
            # first, and take the locking path only when some rows have moved on and others
            # not. While executors keep winning that race (busy, fast ones), every batch
            # takes the locking path.
            with suppress(q.RowsMoved):
                async with self._hot() as run:
                    results = await dispatch_unread(run, requests)
        if results is None:
            async with self._hot() as run:
                results = await dispatch_many(run, requests)
        self._dispatch_found_moved = not all(r.ok for r in results.values())
        return results


async def _skip(conn: AsyncConnection, instance_id: str, reason: str) -> None:
    """PENDING -> SKIPPED for a row this transaction just inserted."""
    if not await rows.move(conn, instance_id, Status.PENDING, Status.SKIPPED, reason=reason):
        raise StoreError(f"instance {instance_id!r} was not PENDING right after its insert")


async def _taken(run: Runner, news: Sequence[NewInstance]) -> tuple[dict[str, str], set[str]]:
    """Dedupe keys already stored (key -> row id), and ids already stored, among `news`: one
    SELECT per chunk of instances, through both unique indexes."""
    by_key: dict[str, str] = {}
    ids: set[str] = set()
    for part in sql_chunks.chunks(sorted(news, key=lambda n: n.dedupe_key)):
        keys, wanted = {n.dedupe_key for n in part}, {n.id for n in part}
        for m in await run.rows(*templates.bind_taken(sorted(keys), sorted(wanted))):
            key, found = str(m["dedupe_key"]), str(m["id"])
            if key in keys:
                by_key[key] = found
            if found in wanted:
                ids.add(found)
    return by_key, ids


async def _fenced(
    run: Runner, news: Sequence[NewInstance], tokens: Sequence[int | None]
) -> set[int]:
    """Positions in `news` whose creator's leader token (`tokens`, None: no leader) is older
    than the token its task holds (`sql_definitions.newer_held`): not to be created."""
    writes = [(n.task_id, t) for n, t in zip(news, tokens, strict=True) if t is not None]
    if not writes:
        return set()
    newer = await newer_held(run, writes)
    return {
        i
        for i, (n, t) in enumerate(zip(news, tokens, strict=True))
        if t is not None and (n.task_id, t) in newer
    }


def _split(
    news: Sequence[NewInstance], by_key: dict[str, str], ids: set[str], fenced: set[int]
) -> tuple[list[CreateResult], list[NewInstance]]:
    """Results in request order and the instances to insert. Like sequential
    `create_instance` calls: a fenced request writes nothing, a taken key names its row, else
    a taken id names itself."""
    results: list[CreateResult] = []
    fresh: list[NewInstance] = []
    keys, used_ids = dict(by_key), set(ids)
    for i, new in enumerate(news):
        if i in fenced:
            results.append(CreateResult(created=False, instance_id=new.id, fenced=True))
        elif new.dedupe_key in keys:
            results.append(CreateResult(created=False, instance_id=keys[new.dedupe_key]))
        elif new.id in used_ids:
            results.append(CreateResult(created=False, instance_id=new.id))
        else:
            keys[new.dedupe_key] = new.id
            used_ids.add(new.id)
            fresh.append(new)
            results.append(CreateResult(created=True, instance_id=new.id))
    return results, fresh


async def create_many(
    run: Runner, news: Sequence[NewInstance], tokens: Sequence[int | None]
) -> list[CreateResult]:
    """Insert the PENDING rows of `news` whose key and id are free and that are not fenced by
    their creator's leader token (`tokens`), with their history rows; results in request
    order. A key taken concurrently raises `ConstraintViolation`."""
    fenced = await _fenced(run, news, tokens)
    results, fresh = _split(news, *await _taken(run, news), fenced)
    # In key order, so two batches racing for the same keys wait instead of deadlocking.
    fresh.sort(key=lambda n: n.dedupe_key)
    values = [rows.instance_values(n) for n in fresh]
    for span in sql_chunks.sized_chunks(
        range(len(fresh)), [sql_chunks.row_size(v) for v in values]
    ):
        await run.insert(*templates.bind_insert([values[i] for i in span]))
        part = [fresh[i] for i in span]
        await q.append_history(
            run,
            sorted(n.id for n in part),
            src=None,
            owners={n.id: n.created_by for n in part},
            reasons={n.id: n.reason for n in part},
        )
    return results


async def dispatch_many(run: Runner, requests: Sequence[DispatchRequest]) -> dict[str, CasResult]:
    """CAS src -> DISPATCHED for each request whose row is at (src, attempt) under its lock;
    one UPDATE and one history INSERT per source status and chunk."""
    results: dict[str, CasResult] = {}
    for part in sql_chunks.chunks(sorted(requests, key=lambda r: r.instance_id)):
        seen = await q.lock_states(run, [r.instance_id for r in part])
        groups: dict[Status, list[tuple[str, int]]] = {}
        for r in part:
            lost = _lost(r, seen)
            results[r.instance_id] = lost or CasResult(ok=True)
            if lost is None:
                groups.setdefault(r.src, []).append((r.instance_id, r.attempt))
        for src, pairs in sorted(groups.items(), key=lambda g: g[0].value):
            await dispatch_rows(run, src, pairs)
    return {r.instance_id: results[r.instance_id] for r in requests}


def _lost(request: DispatchRequest, seen: Mapping[str, q.Seen]) -> CasResult | None:
    """The lost CAS of `request` when its row, as read under its lock, is not at the
    request's (src, attempt); None when the CAS can land."""
    state = seen.get(request.instance_id)
    if state is not None and (state.status, state.attempt) == (request.src, request.attempt):
        return None
    return CasResult(ok=False, found=None if state is None else state.status)


async def dispatch_unread(run: Runner, requests: Sequence[DispatchRequest]) -> dict[str, CasResult]:
    """`dispatch_many` for requests that share one source status, updating before reading:
    each chunk's CAS UPDATE (it locks the rows in id order) must match all of its rows, or
    none. When it matches none, every row of the chunk has moved on (an executor that read
    its entry first claimed it): the rows are then read under their locks for the statuses
    that stopped them, in the same transaction. When it matches some but not all, `q.RowsMoved`
    and the caller's transaction rolls back (which rows it moved cannot be told apart from
    rows moved to DISPATCHED by another writer).

    No match means moved on for good: a row leaves (src, attempt) only forward (PENDING at an
    attempt is entered once, RETRYING once per run), so the locking path would find the same.
    A row found back at it under the lock (a pathological interleaving) raises `RowsMoved`
    all the same, leaving it to the locking path."""
    results: dict[str, CasResult] = {}
    for part in sql_chunks.chunks(sorted(requests, key=lambda r: r.instance_id)):
        src, pairs = part[0].src, [(r.instance_id, r.attempt) for r in part]
        matched = await run.count(*templates.bind_update(src, pairs, [_DISPATCHED] * len(pairs)))
        if matched == len(pairs):
            await _append_published(run, src, pairs)
            results.update((r.instance_id, CasResult(ok=True)) for r in part)
            continue
        seen = await q.lock_states(run, [r.instance_id for r in part]) if matched == 0 else {}
        lost = {r.instance_id: _lost(r, seen) for r in part}
        if matched or None in lost.values():
            raise q.RowsMoved(f"dispatch batch: {matched} rows matched, {len(pairs)} expected")
        results.update((i, cas) for i, cas in lost.items() if cas is not None)
    return {r.instance_id: results[r.instance_id] for r in requests}


_DISPATCHED = rows.status_values(Status.DISPATCHED, None, None, None) | {
    "updated_at_ms": templates.NOW
}
"""The columns every move to DISPATCHED sets (`sql_templates.bind_update` values)."""


async def dispatch_rows(
    run: Runner,
    src: Status,
    pairs: Sequence[tuple[str, int]],
    *,
    reason: str = PUBLISHED,
    at_ms: int | None = None,
) -> None:
    """CAS the rows of `pairs` (id, attempt) from `src` to DISPATCHED (all must match), and
    their history rows with `reason`. `at_ms`: the time to record (epoch ms, the database
    clock as read earlier in the transaction); None: the database clock of the statement."""
    values = _DISPATCHED if at_ms is None else _DISPATCHED | {"updated_at_ms": at_ms}
    await q.cas_update(run, src, pairs, [values] * len(pairs), "dispatch batch")
    await _append_published(run, src, pairs, reason)


async def _append_published(
    run: Runner, src: Status, pairs: Sequence[tuple[str, int]], reason: str = PUBLISHED
) -> None:
    """The history rows of the moves of `pairs` from `src` to DISPATCHED, with `reason`."""
    ids = sorted(i for i, _ in pairs)
    await q.append_history(
        run, ids, src=src, owners=dict.fromkeys(ids), reasons=dict.fromkeys(ids, reason)
    )
