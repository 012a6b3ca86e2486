"""The records the store port takes and returns (see `port` for the invariants behind them).
Times are UTC epoch milliseconds (`*_ms`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from taskstream.core.states import FailClass, Status


def stored_json(value: Any) -> str:
    """The text a store keeps for a JSON value: sorted keys, no whitespace, UTF-8 kept as
    is, so equal values store as equal text on every dialect. `TypeError` or `ValueError`
    (NaN or infinity, a key that does not sort with the others) when it has none."""
    return json.dumps(
        value, sort_keys=True, allow_nan=False, separators=(",", ":"), ensure_ascii=False
    )


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8 (`UnicodeEncodeError` for a lone surrogate)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class DefinitionRecord:
    """A stored task definition: the validated spec as JSON plus operator state."""

    task_id: str
    spec: dict[str, Any]
    spec_hash: str
    paused: bool = False
    updated_at_ms: int = 0
    schedule_from_ms: int | None = None
    cursor_ms: int | None = None
    """The scheduler's cursor when read (ms); None while no tick of the task was decided."""
    """When the stored `schedule` took effect (db clock, ms): set at creation and whenever an
    apply changed it; None for definitions stored before it was kept."""


@dataclass(frozen=True, slots=True)
class NewInstance:
    """Everything needed to insert a PENDING instance."""

    id: str
    task_id: str
    agent: str
    dedupe_key: str
    scheduled_for_ms: int
    priority: str = "default"
    business_date: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 1
    not_before_ms: int | None = None
    deadline_ms: int | None = None
    trace_id: str = ""
    reason: str = "scheduled"
    created_by: str | None = None
    """Who made it, recorded as the owner of its creation's history row: the operator of a
    trigger or backfill; None for a scheduler's tick."""


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One row of `task_instances`."""

    id: str
    task_id: str
    agent: str
    dedupe_key: str
    status: Status
    attempt: int
    max_attempts: int
    priority: str
    scheduled_for_ms: int
    business_date: str | None
    payload: dict[str, Any]
    result: Any
    context: dict[str, Any]
    fail_class: FailClass | None
    last_error: str | None
    lease_owner: str | None
    lease_expires_at_ms: int | None
    not_before_ms: int | None
    deadline_ms: int | None
    next_attempt_at_ms: int | None
    trace_id: str
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class UnreadableRow:
    """A `task_instances` row that a read of many passes over, in its place in the read's
    order, because it holds what taskstream never writes: `error` is the `StoreCorrupt`
    text naming its column. `updated_at_ms`, `next_attempt_at_ms` and `scheduled_for_ms`
    (integer columns, which always read) place it in the orders reads go by. The row is left
    as it is."""

    id: str
    updated_at_ms: int
    error: str
    next_attempt_at_ms: int | None
    scheduled_for_ms: int


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Instances by status: `counts` has every `Status` (0 when none). `unreadable` names,
    one text per value, the rows whose `status` no state has (a hand edit in SQL): one row
    that holds it (the `StoreCorrupt` text) and how many do. They are in no count."""

    counts: dict[Status, int]
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One status change of an instance."""

    instance_id: str
    from_status: Status | None
    to_status: Status
    attempt: int
    owner: str | None
    reason: str
    at_ms: int
    note: str | None = None
    """The why of the move beyond its reason, else None: what the person who made it gave
    (`retry --reason`), or what the sweeper found (a release of a run whose end was lost)."""


def made_move(
    history: Iterable[HistoryRow],
    to_status: Status,
    *,
    attempt: int,
    owner: str | None,
    reason: str,
    from_status: Status | None = None,
) -> bool:
    """Whether `history` holds the move to `to_status` at `attempt` by `owner` with `reason`
    (and from `from_status`, when given): how a writer whose answer was lost recognises its
    own move, which only it makes, once per attempt."""
    return any(
        h.to_status is to_status
        and h.attempt == attempt
        and h.owner == owner
        and h.reason == reason
        and (from_status is None or h.from_status is from_status)
        for h in history
    )


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One scheduling decision: the explain log."""

    task_id: str
    fire_time_ms: int
    decision: str
    reason: str
    details: dict[str, Any]
    instance_id: str | None
    decided_at_ms: int


@dataclass(frozen=True, slots=True)
class CreateResult:
    """`created` is False when the dedupe key already existed (`instance_id` names that row),
    or when the request was `fenced`: its creator's leader token is older than the one its
    task holds, so nothing was written (`instance_id` is the requested id)."""

    created: bool
    instance_id: str
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """The outbox's last step for one instance: CAS `src` (PENDING or RETRYING) -> DISPATCHED
    at `attempt`, after its entry was added to a stream."""

    instance_id: str
    src: Status
    attempt: int


@dataclass(frozen=True, slots=True)
class CasResult:
    """Outcome of a compare-and-set. `found` is the status that stopped it (None when the row
    does not exist); it is the CAS's own source status only when the attempt differed (a row
    that reached the source just after the miss is moved after all: see `transition`)."""

    ok: bool
    found: Status | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A won claim: `token` is the new attempt number, the fencing token for every later
    write of this run."""

    token: int
    lease_expires_at_ms: int


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Claim `instance_id` if it is DISPATCHED with `attempt == expected_attempt`; the lease
    ends `lease_s` seconds after the database clock's now."""

    instance_id: str
    expected_attempt: int
    lease_s: float


@dataclass(frozen=True, slots=True)
class Claimed:
    """A won claim and the row as it is after the claim (status RUNNING, attempt = token)."""

    token: int
    lease_expires_at_ms: int
    row: InstanceRow
    payload_bytes: int | None = None
    """Size of the payload as stored (`stored_json`, UTF-8), when the claim read its text
    (None: not known; `stored_payload_bytes` measures it)."""


@dataclass(frozen=True, slots=True)
class FinishRequest:
    """The final CAS of one run: RUNNING -> `dst` where attempt == `token`, with the run's
    result and side-effect keys."""

    instance_id: str
    token: int
    dst: Status
    reason: str
    result: Any = None
    fail_class: FailClass | None = None
    error: str | None = None
    next_attempt_at_ms: int | None = None
    side_effects: tuple[str, ...] = ()
    owner: str | None = None
    """The lease owner that claimed the run at `token`, when the caller knows it (an executor
    finishing its own run). Only the history row uses it; with it, and no side effects, a
    store may write the CAS without first reading the row."""
    review: str | None = None
    """When set, a winning finish also queues the instance for human review with this reason,
    in the same transaction (a `manual_review` failure is never FAILED without its entry)."""
    result_json: str | None = None
    """`stored_json(result)`, when the caller has already encoded it (an executor checks a
    result as it will be stored): the store keeps this text instead of encoding again."""


def stored_payload_bytes(claimed: Claimed) -> int:
    """Size of a claimed run's payload as stored, in UTF-8 bytes."""
    if claimed.payload_bytes is not None:
        return claimed.payload_bytes
    return utf8_size(stored_json(claimed.row.payload))
