"""The store port: what the rest of taskstream may ask of the source of truth.

Invariants every adapter keeps:
- Every status write is compare-and-set on (id, status[, attempt]) and appends one
  `instance_history` row in the same transaction. A lost race returns `CasResult(ok=False)`
  with the status it found; it never raises.
- `dedupe_key` is UNIQUE: `create_instance` reports `created=False` instead of a second row.
- Times are UTC epoch milliseconds (`*_ms`). Leases are computed from the database clock.
- Driver errors surface as `StoreUnavailable` / `StoreError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from taskstream.core.states import FailClass, Status
from taskstream.core.store.records import (
    CasResult,
    Claim,
    Claimed,
    ClaimRequest,
    CreateResult,
    DecisionRow,
    DefinitionRecord,
    DispatchRequest,
    FinishRequest,
    HistoryRow,
    InstanceRow,
    NewInstance,
    StatusCounts,
    UnreadableRow,
)

__all__ = [
    "CasResult",
    "Claim",
    "ClaimRequest",
    "Claimed",
    "CreateResult",
    "DecisionRow",
    "DefinitionRecord",
    "DispatchRequest",
    "FinishRequest",
    "HistoryRow",
    "InstanceRow",
    "NewInstance",
    "StatusCounts",
    "Store",
    "UnreadableRow",
]


class Store(Protocol):
    """The store port. See the module docstring for the invariants."""

    async def close(self) -> None: ...

    async def ping(self) -> None: ...

    async def db_now_ms(self) -> int: ...

    async def clock_sample(self, host_ms: Callable[[], int]) -> tuple[int, int, int]:
        """(database now, `host_ms()` just before, just after) around the clock's statement
        alone: a wait for a pooled connection is outside the bracket. Ms."""
        ...

    # definitions
    async def upsert_definitions(
        self, records: list[DefinitionRecord], *, now_ms: int | None = None
    ) -> dict[str, str]:
        """Insert or update; returns task_id -> "created" | "updated" | "unchanged". A created
        task, and one whose `schedule` changed, gets `schedule_from_ms` = `now_ms` (ms; the
        database clock when None)."""
        ...

    async def apply_definitions(
        self,
        records: list[DefinitionRecord],
        upstreams: Mapping[str, Mapping[str, Any]],
        *,
        now_ms: int | None = None,
    ) -> tuple[dict[str, str], dict[str, str]]:
        """`upsert_definitions` and `upsert_upstreams` as one transaction: on any error
        neither is stored. Returns (task_id -> change, upstream name -> change)."""
        ...

    async def list_definitions(self) -> list[DefinitionRecord]: ...

    async def definitions_version(self) -> str:
        """Changes whenever any definition is added, changed or paused."""
        ...

    async def set_paused(self, task_id: str, paused: bool) -> bool | None:
        """Set the pause flag: True when it changed, False when it was already so (nothing
        written), None when the task is not defined."""
        ...

    async def get_cursor(self, task_id: str) -> int | None:
        """The last fire time (ms) the scheduler has decided for this task."""
        ...

    async def max_cursor_token(self) -> int | None:
        """The largest leader token any cursor was written with; None when none was."""
        ...

    async def set_cursor(
        self, task_id: str, fire_time_ms: int, *, token: int | None = None
    ) -> bool:
        """Store the cursor. With `token` (a leader-lease fencing token) the write is rejected
        (False) when a newer token has written; False too for an unknown task."""
        ...

    # instances
    async def create_instance(
        self, new: NewInstance, *, skipped: str | None = None, token: int | None = None
    ) -> CreateResult:
        """Insert `new` as PENDING with its history row; with `skipped` (a reason) move it on
        to SKIPPED in the same transaction, so it is never seen PENDING. With `token` (the
        creating scheduler's leader-lease token) nothing is written when the task holds a
        newer token: the result is `fenced`."""
        ...

    async def create_instances(
        self, news: Sequence[NewInstance], *, tokens: Sequence[int | None] | None = None
    ) -> list[CreateResult]:
        """`create_instance` for many, in request order, normally in one transaction. A later
        request with the dedupe key (or id) of an earlier one is its duplicate. `tokens`, one
        per instance (None: no leader), fence them as `create_instance`'s `token` does."""
        ...

    async def dispatch_many(self, requests: Sequence[DispatchRequest]) -> dict[str, CasResult]:
        """CAS each request's row `src` -> DISPATCHED (reason `published`) in one transaction;
        a row no longer at (`src`, `attempt`) is left alone and gets `ok=False`.
        `InvalidTransition` before any SQL for a `src` other than PENDING or RETRYING, and
        `ValueError` for an instance named twice."""
        ...

    async def get_instance(self, instance_id: str) -> InstanceRow | None: ...

    async def list_instances(
        self, *, task_id: str | None = None, status: Status | None = None, limit: int = 100
    ) -> list[InstanceRow]:
        """Matching instances, oldest `scheduled_for_ms` first (then id), at most `limit`;
        `StoreCorrupt` naming the first row that does not decode."""
        ...

    async def list_instances_or_unreadable(
        self, *, task_id: str | None = None, status: Status | None = None, limit: int = 100
    ) -> list[InstanceRow | UnreadableRow]:
        """`list_instances` for an operator's listing, which must show the rows it can read:
        a row that does not decode (`StoreCorrupt`) is an `UnreadableRow` in its place."""
        ...

    async def count_by_status(self) -> StatusCounts:
        """Instances by status; the rows of a status no state has are named, not counted."""
        ...

    async def history(self, instance_id: str) -> list[HistoryRow]: ...

    async def histories(self, instance_ids: Sequence[str]) -> dict[str, list[HistoryRow]]: ...

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
        """CAS src -> dst (and attempt == `attempt`, and the lease still ending at
        `lease_until` ms, when given), plus a history row (carrying `note`, the why of the
        move beyond its reason)."""
        ...

    async def claim(
        self, instance_id: str, *, expected_attempt: int, owner: str, lease_s: float
    ) -> Claim | None:
        """CAS DISPATCHED -> RUNNING where attempt == expected_attempt; attempt += 1; the lease
        ends `lease_s` after the database clock's now. None when the race was lost."""
        ...

    async def extend_lease(self, instance_id: str, *, token: int, lease_s: float) -> bool:
        """Push the lease to db-now + lease_s while RUNNING with attempt == token."""
        ...

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
        """RUNNING -> dst where attempt == token, clearing the lease, and insert the side
        effect keys, all in one transaction. A stale token changes nothing."""
        ...

    # batches: the same compare-and-set rules, one transaction for many instances

    async def claim_many(self, requests: list[ClaimRequest], *, owner: str) -> dict[str, Claimed]:
        """`claim` for many instances in one transaction; returns only the won claims (a row
        that does not decode, `StoreCorrupt`, is not claimed and is left as it is). A
        claim names an entry read from a stream, so its XADD happened: a row still PENDING or
        RETRYING at the expected attempt (the outbox's CAS not landed yet) is first moved to
        DISPATCHED in the same transaction (history reason `seen_on_stream`), then claimed."""
        ...

    async def finish_many(self, requests: list[FinishRequest]) -> dict[str, CasResult]:
        """`finish` for many runs in one transaction. A fenced run changes nothing and gets
        `ok=False`; the others commit. Side-effect keys that already exist fence only the run
        that carries them."""
        ...

    async def extend_leases(
        self, held: list[tuple[str, int]], *, lease_s: float
    ) -> set[tuple[str, int]]:
        """`extend_lease` for many (instance_id, token) pairs; returns the pairs still held
        (a row is RUNNING at one attempt, so of two tokens of one instance at most one is)."""
        ...

    # work finding

    async def due_retries(
        self, *, now_ms: int, limit: int, after: tuple[int, str] | None = None
    ) -> list[InstanceRow | UnreadableRow]:
        """RETRYING rows with `next_attempt_at_ms <= now_ms`, oldest due first (then id);
        only those past `after` ((next_attempt_at_ms, id)) when given. A row that does not
        decode (`StoreCorrupt`) is an `UnreadableRow` in its place, so that it neither fails
        the read of the others nor breaks the paging."""
        ...

    async def stale(
        self,
        statuses: list[Status],
        *,
        updated_before_ms: int,
        limit: int,
        after: tuple[int, str] | None = None,
    ) -> list[InstanceRow | UnreadableRow]:
        """Rows in `statuses` not updated since `updated_before_ms`, oldest first (then by
        id), from just past `after` (an (updated_at_ms, id) already seen) when given. A row
        that does not decode (`StoreCorrupt`) is an `UnreadableRow` in its place, so that
        it neither fails the read of the others nor breaks the paging."""
        ...

    async def poisoned(
        self, *, limit: int, before: tuple[int, str] | None = None
    ) -> list[InstanceRow | UnreadableRow]:
        """Rows FAILED `poison`, the latest failure first (`updated_at_ms`, then id, both
        descending; a FAILED row changes only when requeued, so its `updated_at_ms` is when
        it failed), at most `limit`; only those before `before` (an (updated_at_ms, id)
        already seen) when given; one that does not decode (such as a row failed as
        `corrupt_row`) as an `UnreadableRow` in its place."""
        ...

    async def side_effect_done(self, key: str) -> bool:
        """True when a side effect with this idempotency key has been committed."""
        ...

    async def count_history(self, instance_id: str, *, reason: str) -> int:
        """How many history rows of this instance carry `reason`."""
        ...

    async def add_review(self, instance_id: str, reason: str) -> None:
        """Put an instance in the human review queue (once: a second add is a no-op)."""
        ...

    # scheduling

    async def mark_ready(
        self, name: str, business_date: str, *, claim: tuple[str, int] | None = None
    ) -> bool:
        """Set a readiness marker for a business date (ISO date); False if already set. With
        `claim` (instance id, token), only while that instance is RUNNING at that token;
        `ClaimLost` otherwise, and nothing is set."""
        ...

    async def ready_markers(self, names: Sequence[str], business_date: str) -> set[str]:
        """Which of `names` are set for `business_date`."""
        ...

    async def upsert_upstreams(self, configs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Store upstream limits by name; name -> "created" | "updated" | "unchanged"."""
        ...

    async def list_upstreams(self) -> dict[str, dict[str, Any]]:
        """Every stored upstream's limits, by name."""
        ...

    async def next_retry_at(self, *, after_ms: int | None = None) -> int | None:
        """The earliest due time (ms) of any RETRYING row, of those due after `after_ms` when
        given; None when none waits."""
        ...

    async def active_instances(
        self, task_id: str, *, limit: int = 10, newest_first: bool = False
    ) -> list[InstanceRow | UnreadableRow]:
        """Up to `limit` instances of the task not yet settled, oldest fire time first (the
        newest first with `newest_first`). A row that does not decode (`StoreCorrupt`) is an
        `UnreadableRow` in its place: it is still in flight for the overlap policy."""
        ...

    async def existing_instances(self, instance_ids: Sequence[str]) -> set[str]:
        """Those of `instance_ids` that exist (any status)."""
        ...

    async def claim_cursors(self, token: int) -> int:
        """A new leader takes every task over: each cursor token below `token` becomes
        `token`, so that older leaders' cursor writes, decision records and instance creations
        are refused from then on. Returns how many definitions changed hands."""
        ...

    # explain log
    async def record_decision(self, row: DecisionRow, *, token: int | None = None) -> bool:
        """Append a decision. With `token` (a leader-lease fencing token) it is refused
        (False) when the task's cursor holds a newer token; True when written."""
        ...

    async def decisions(
        self, task_id: str, *, since_ms: int | None = None, limit: int = 100
    ) -> list[DecisionRow]: ...
