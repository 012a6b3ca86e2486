"""`SqlStore`: the store port over SQLAlchemy Core (async) on MySQL/MariaDB, SQLite, PostgreSQL.

Every method is one transaction (`finish_many` falls back to one per run when a concurrent
writer records one of its side-effect keys first). Status writes are compare-and-set and append
their history row in the same transaction; a lost race is a `CasResult(ok=False, found=...)`,
never an exception. Transitions are checked against the state table before any SQL is sent.
Leases and timestamps come from the database clock. Driver errors surface as
`StoreUnavailable` / `StoreError` naming the redacted URL; a write transaction the database
rolls back for a conflict (a deadlock, a lock wait timeout) is made again at once, a few
times (`sql_conflicts`), before it is raised as `StoreConflict`. The SQL lives in `sql_instances`,
`sql_batch`, `sql_finishes`, `sql_queries` and `sql_definitions`; the methods here, and those
of the mixins `sql_reads`, `sql_tasks`, `sql_outbox` and `sql_scheduling`, own the transactions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial
from typing import Any, Self

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskstream.core.states import FailClass, Status, check_transition
from taskstream.core.store import sql_batch as batch
from taskstream.core.store import sql_finishes as finishes
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as queries
from taskstream.core.store.dbclock import db_now_ms
from taskstream.core.store.port import (
    CasResult,
    Claim,
    Claimed,
    ClaimRequest,
    FinishRequest,
)
from taskstream.core.store.sql_conflicts import conflicts_retried
from taskstream.core.store.sql_driver import driver_enabled, driver_transaction
from taskstream.core.store.sql_engine import READ_ONLY, make_engine
from taskstream.core.store.sql_errors import ConstraintViolation, translate_errors
from taskstream.core.store.sql_outbox import OutboxMethods
from taskstream.core.store.sql_prepared import CoreRunner, Runner
from taskstream.core.store.sql_reads import ReadMethods
from taskstream.core.store.sql_scheduling import SchedulingMethods
from taskstream.core.store.sql_tasks import DefinitionMethods
from taskstream.core.store.urls import normalize_url, redact_url


class SqlStore(ReadMethods, DefinitionMethods, OutboxMethods, SchedulingMethods):
    """The SQL adapter of `taskstream.core.store.port.Store`. Build it with `connect`."""

    def __init__(self, engine: AsyncEngine, *, display_url: str) -> None:
        """Wrap `engine` (from `sql_engine.make_engine`); `display_url` is the redacted URL
        used in error messages."""
        self._engine = engine
        self._reader = engine.execution_options(**{READ_ONLY: True})
        self._driver = driver_enabled(engine)
        self.statement_listeners: list[Callable[[str], None]] = []
        """Called with the text of each statement the driver path (`_hot`) sends; the
        engine's statements are seen through SQLAlchemy's events."""
        self.display_url = display_url

    @classmethod
    async def connect(cls, url: str, *, check: bool = True) -> Self:
        """Open a store on a user URL (`mysql://`, `postgresql://`, `sqlite:///path`, ...) and,
        with `check`, make sure it answers. Raises `ConfigError` for an unsupported URL and
        `StoreUnavailable` when the database cannot be reached."""
        store = cls(make_engine(normalize_url(url)), display_url=redact_url(url))
        if not check:
            return store
        try:
            await store.ping()
        except BaseException:
            await store.close()
            raise
        return store

    @property
    def engine(self) -> AsyncEngine:
        """The underlying engine, for migrations, diagnostics and tests."""
        return self._engine

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        async with translate_errors(self.display_url), self._engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def _hot(self) -> AsyncIterator[Runner]:
        """A write transaction for the hot path's templates: on the driver when it can run
        them (`sql_driver`), else on the engine."""
        if self._driver:
            listeners = self.statement_listeners
            async with driver_transaction(self._engine, self.display_url, listeners) as run:
                yield run
        else:
            async with self._write() as conn:
                yield CoreRunner(conn)

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with translate_errors(self.display_url), self._reader.connect() as conn:
            yield conn

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._engine.dispose()

    async def ping(self) -> None:
        """Round-trip to the database; `StoreUnavailable` when it does not answer."""
        async with self._read() as conn:
            await conn.execute(select(1))

    async def db_now_ms(self) -> int:
        """The database clock, UTC epoch milliseconds."""
        async with self._read() as conn:
            return await _db_now(conn)

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        async with self._read() as conn:
            before = host_ms()
            return await _db_now(conn), before, host_ms()

    async def transition(
        self,
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
    ) -> CasResult:
        """CAS src -> dst (and attempt == `attempt` when given) plus a history row.
        `lease_until` (ms): move only while the lease still ends there, as it was read; a
        heartbeat that extended it since makes the CAS lose (found RUNNING). `note`: the why
        of the move beyond its reason (a person's), kept with its history row (cut to
        `NOTE_LEN` chars).

        Sets `fail_class` (None unless FAILED) and `next_attempt_at_ms` (None clears it), sets
        `last_error` when `error` is given, and clears the lease unless dst is RUNNING. Entering
        RUNNING this way neither bumps the attempt nor takes a lease: executors use `claim`.
        FAILED -> PENDING (a manual requeue) moves to attempt + 1, fencing off the entries
        and runs of the attempts before, and resolves the instance's open review entry
        (`resolved_by`: `owner`).
        Raises `InvalidTransition` before any SQL when the table forbids src -> dst.

        A lost CAS reports the status that stopped it. Under READ COMMITTED another commit can
        bring the row to `src` between the UPDATE that missed it and the read of its status:
        the UPDATE is then tried once more, so `found` is `src` only when `attempt` differs.
        """
        check_transition(src, dst, fail_class=fail_class)
        move = partial(
            rows.move,
            instance_id=instance_id,
            src=src,
            dst=dst,
            reason=reason,
            attempt=attempt,
            owner=owner,
            fail_class=fail_class,
            error=error,
            next_attempt_at_ms=next_attempt_at_ms,
            lease_until=lease_until,
            note=note,
        )

        async def once() -> CasResult:
            async with self._write() as conn:
                for _ in range(2):
                    if await move(conn):
                        return CasResult(ok=True)
                    found = await rows.status_of(conn, instance_id)
                    if found is not src:
                        break
            return CasResult(ok=False, found=found)

        return await conflicts_retried(once)

    async def claim(
        self, instance_id: str, *, expected_attempt: int, owner: str, lease_s: float
    ) -> Claim | None:
        """CAS DISPATCHED -> RUNNING where attempt == expected_attempt, attempt += 1, lease to
        `owner` until db-now + `lease_s`. The new attempt is the fencing token. None when the
        race was lost."""
        lease_length_ms = rows.lease_ms(lease_s)

        async def once() -> Claim | None:
            async with self._write() as conn:
                return await batch.claim_one(
                    conn, instance_id, expected_attempt, owner, lease_length_ms
                )

        return await conflicts_retried(once)

    async def extend_lease(self, instance_id: str, *, token: int, lease_s: float) -> bool:
        """Push the lease to db-now + `lease_s` while RUNNING with attempt == token."""
        lease_ms = rows.lease_ms(lease_s)

        async def once() -> bool:
            async with self._write() as conn:
                return await rows.extend_lease(conn, instance_id, token, lease_ms)

        return await conflicts_retried(once)

    async def finish(
        self,
        instance_id: str,
        *,
        token: int,
        dst: Status,
        reason: str,
        result: Any = None,
        fail_class: FailClass | None = None,
        error: str | None = None,
        next_attempt_at_ms: int | None = None,
        side_effects: list[str] | None = None,
    ) -> CasResult:
        """RUNNING -> dst where attempt == token, clearing the lease, storing the outcome and
        the side effect keys, in one transaction. A stale token, or a side effect key that was
        already committed, rolls everything back: ok=False with the status found."""
        keys = tuple(side_effects or ())
        request = FinishRequest(
            instance_id, token, dst, reason, result, fail_class, error, next_attempt_at_ms, keys
        )
        return await self._finish_one(finishes.prepare_finish(request))

    async def _finish_one(self, prepared: finishes.PreparedFinish) -> CasResult:
        return await conflicts_retried(partial(self._finish_one_once, prepared))

    async def _finish_one_once(self, prepared: finishes.PreparedFinish) -> CasResult:
        try:
            async with self._write() as conn:
                return await finishes.finish_one(conn, prepared)
        except ConstraintViolation:
            async with self._read() as conn:
                found = await rows.status_of(conn, prepared.request.instance_id)
            return CasResult(ok=False, found=found)

    # batches: one transaction each, a constant number of statements per 200 ids

    async def claim_many(self, requests: list[ClaimRequest], *, owner: str) -> dict[str, Claimed]:
        """`claim` for many instances in one transaction; the won claims by instance id, each
        with the row as claimed. `ValueError` before any SQL for a non-positive lease."""
        options = batch.plan_claims(requests)
        if not options:
            return {}

        async def once() -> dict[str, Claimed]:
            async with self._hot() as run:
                return await batch.claim_many(run, options, owner)

        return await conflicts_retried(once)

    async def finish_many(self, requests: list[FinishRequest]) -> dict[str, CasResult]:
        """`finish` for many runs in one transaction, with the results sequential `finish`
        calls in request order would give. `InvalidTransition`, or `ValueError` for an
        instance named twice, before any SQL."""
        prepared = finishes.prepare_finishes(requests)
        if not prepared:
            return {}
        return await conflicts_retried(partial(self._finish_many_once, prepared))

    async def _finish_many_once(
        self, prepared: list[finishes.PreparedFinish]
    ) -> dict[str, CasResult]:
        if finishes.unread_ok(prepared):
            # Usually every run still holds its row: update without reading first, and take
            # the locking path only when some row has moved on (a fenced run).
            with suppress(queries.RowsMoved):
                async with self._hot() as run:
                    return await finishes.finish_unread(run, prepared)
        try:
            async with self._write() as conn:
                return await finishes.finish_many(conn, prepared)
        except ConstraintViolation:
            # A concurrent writer recorded one of the keys after the pre-check: settle each
            # run on its own so that only the run carrying that key is fenced.
            return {p.request.instance_id: await self._finish_one(p) for p in prepared}

    async def extend_leases(
        self, held: list[tuple[str, int]], *, lease_s: float
    ) -> set[tuple[str, int]]:
        """`extend_lease` for many (instance_id, token) pairs; returns the pairs still held
        (a row is RUNNING at one attempt, so of two tokens of one instance at most one is)."""
        lease_length_ms = rows.lease_ms(lease_s)
        if not held:
            return set()

        async def once() -> set[tuple[str, int]]:
            async with self._write() as conn:
                return await batch.extend_leases(conn, held, lease_length_ms)

        return await conflicts_retried(once)

    async def add_review(self, instance_id: str, reason: str) -> None:
        """Queue an existing instance for human review, once: while it has an unresolved
        entry, another add is a no-op."""
        async with self._write() as conn:
            await queries.add_review(conn, instance_id, reason)


async def _db_now(conn: AsyncConnection) -> int:
    """The database clock, UTC epoch milliseconds, read on `conn`."""
    return int((await conn.execute(select(db_now_ms()))).scalar_one())
