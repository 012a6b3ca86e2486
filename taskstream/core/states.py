"""The instance state machine of DESIGN.md §3: one table, one checked transition function.

Every store write goes through `check_transition`; terminal states have no exits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

from taskstream.core.errors import InvalidTransition
from taskstream.core.reasons import REQUEUED


class Status(StrEnum):
    """Lifecycle status of a task instance."""

    PENDING = "PENDING"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    TIMEOUT = "TIMEOUT"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"


class FailClass(StrEnum):
    """Why a FAILED instance failed."""

    FATAL = "fatal"
    EXHAUSTED = "exhausted"
    MANUAL_REVIEW = "manual_review"
    POISON = "poison"
    LOW_QUALITY = "low_quality"
    REPLACED = "replaced"
    """Cancelled by a newer run of the same task (overlap policy `replace`)."""


TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.DISPATCHED, Status.SKIPPED}),
    Status.DISPATCHED: frozenset({Status.RUNNING, Status.TIMEOUT, Status.FAILED}),
    Status.RUNNING: frozenset({Status.SUCCESS, Status.FAILED, Status.RETRYING, Status.TIMEOUT}),
    Status.RETRYING: frozenset({Status.DISPATCHED, Status.FAILED}),
    Status.TIMEOUT: frozenset({Status.RETRYING, Status.FAILED}),
    # Only a manual requeue, recorded with who and why, leaves FAILED.
    Status.FAILED: frozenset({Status.PENDING}),
    Status.SUCCESS: frozenset(),
    Status.SKIPPED: frozenset(),
}

TERMINAL: frozenset[Status] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
"""States with no exit. FAILED is not terminal: a manual requeue may leave it."""

SETTLED: frozenset[Status] = TERMINAL | {Status.FAILED}
"""States in which no automatic work remains; a redelivered entry for them is only acked."""

AWAITING_CLAIM: frozenset[Status] = frozenset({Status.PENDING, Status.DISPATCHED, Status.RETRYING})
"""States from which an entry of the row's current attempt is claimed (or failed as poison):
DISPATCHED, and PENDING or RETRYING when the entry was read before the outbox's CAS to
DISPATCHED landed (its XADD evidently happened)."""

IN_FLIGHT: tuple[Status, ...] = tuple(sorted(set(Status) - SETTLED, key=lambda s: s.value))
"""States with automatic work left (the rest of `SETTLED`), in name order."""


def failed_as_poison(status: Status, fail_class: FailClass | None) -> bool:
    """FAILED with the fail class `poison`: the only failure an entry can still owe a dead
    letter for (its mover failed between the store's commit and the letter)."""
    return status is Status.FAILED and fail_class is FailClass.POISON


def poisoned_by(
    entry_attempt: int,
    status: Status,
    fail_class: FailClass | None,
    attempt: int,
    *,
    life_began: int,
) -> bool:
    """An instance at `status`, `fail_class` and `attempt` FAILED as poison by the entry of
    `entry_attempt`: unclaimed (the same attempt) or in the run that entry started (+1).

    `life_began` is the attempt the instance's current life began at (`life_began`). The
    attempt after an entry's is also the one a manual requeue moves a FAILED row to, and the
    new life's own entry may fail as poison before any claim: an entry of an earlier life
    started no run of this one, and poisoned nothing in it."""
    in_life = entry_attempt >= life_began
    same_run = attempt in (entry_attempt, entry_attempt + 1)
    return failed_as_poison(status, fail_class) and in_life and same_run


def recorded_by_letter(
    letter_attempts: Iterable[int | None],
    status: Status,
    fail_class: FailClass | None,
    attempt: int,
    *,
    life_began: int,
) -> bool:
    """Some dead letter of an instance, each given by its entry's attempt (None when a letter
    has none that reads as a number), records the failure the instance is in: FAILED as
    poison by that letter's entry (`poisoned_by`). A letter without an attempt is taken at
    its word, for an instance FAILED as poison only. `dead replay` requeues a failure a
    letter records; one that FAILED as poison with no letter recording it lost its letter."""
    if not failed_as_poison(status, fail_class):
        return False
    return any(
        a is None or poisoned_by(a, status, fail_class, attempt, life_began=life_began)
        for a in letter_attempts
    )


def life_start(reasons: Sequence[str]) -> int:
    """Where an instance's current life begins in its history, given the reasons of its
    history rows, oldest first: the index just after its last manual requeue, else 0. The
    counts of a life (attempts, lost runs) start again there."""
    for i in range(len(reasons) - 1, -1, -1):
        if reasons[i] == REQUEUED:
            return i + 1
    return 0


def life_began(history: Iterable[tuple[str, int]]) -> int:
    """The attempt an instance's current life began at, given its history as (reason,
    attempt) pairs, oldest first: that of its last manual requeue (FAILED -> PENDING moves to
    attempt + 1, and the history row carries the new attempt), else 0. Attempts only grow, so
    every entry and run of an earlier life is of an attempt below it."""
    pairs = list(history)
    start = life_start([reason for reason, _ in pairs])
    return pairs[start - 1][1] if start else 0


def last_failure(moves: Iterable[tuple[Status, str]]) -> str | None:
    """The reason recorded with an instance's last move to FAILED, given its history as
    (to status, reason) pairs, oldest first; None when it never failed."""
    failed = None
    for to_status, reason in moves:
        if to_status is Status.FAILED:
            failed = reason
    return failed


def can_transition(src: Status, dst: Status) -> bool:
    """True when the state table allows `src -> dst`."""
    return dst in TRANSITIONS[src]


def check_transition(src: Status, dst: Status, *, fail_class: FailClass | None = None) -> None:
    """Raise `InvalidTransition` unless `src -> dst` is allowed.

    A move to FAILED must name its `fail_class`; no other move may carry one.
    """
    if not can_transition(src, dst):
        raise InvalidTransition(f"{src} -> {dst} is not allowed")
    if (dst is Status.FAILED) != (fail_class is not None):
        raise InvalidTransition(f"{src} -> {dst}: fail_class is required exactly for FAILED")
