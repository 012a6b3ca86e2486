"""Sweep decision (pure): what to do with one pending stream entry that nobody is progressing.

Inputs are facts gathered by the sweeper: the entry (or why it does not decode), how often it
was delivered, the instance row as the store has it, whether the owning consumer is alive,
and the database clock. The decision never depends on the sweeper's own clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from taskstream.core.reasons import AFTER, LEASE_EXPIRED, OWNER_LOST, RELEASED
from taskstream.core.states import AWAITING_CLAIM, SETTLED, FailClass, Status, poisoned_by

LEFT_IN_TIMEOUT = "left_in_timeout"
"""The reason of a TIMEOUT verdict for a run already in TIMEOUT: only the move out of it is left."""


class Action(StrEnum):
    """What the sweeper does with the entry."""

    ACK = "ack"
    """Nothing left to do for it (settled instance, a stale attempt, or one the store never
    made): XACK+XDEL."""
    LEAVE = "leave"
    """Its owner is alive and holds a live lease: leave it."""
    REDELIVER = "redeliver"
    """Delivered but never claimed by a consumer that is gone: publish it again, carrying its
    delivery count (`WorkEntry.redeliveries`)."""
    TIMEOUT = "timeout"
    """Its run lost its owner or its lease: CAS RUNNING -> TIMEOUT, then retry or fail (only
    the second move for a run already in TIMEOUT, `LEFT_IN_TIMEOUT`)."""
    RELEASE = "release"
    """Its run's owner stopped and released it, but the store could not take the release (or
    the run's end), so the owner noted it in Redis (`ReleaseNote`): CAS RUNNING -> RETRYING,
    due now, not an attempt, as that release would have."""
    DEAD_LETTER = "dead_letter"
    """It cannot be handled: move it to the dead-letter stream."""
    POISON = "poison"
    """It keeps killing its consumers: dead-letter it and fail the instance as poison."""


@dataclass(frozen=True, slots=True)
class RowFacts:
    """What the store says about the entry's instance. `life_began`: the attempt its
    current life began at (`states.life_began` of its history; 0 when never requeued), and
    `failed_with`: the reason of its last move to FAILED (`states.last_failure`), both needed
    only for a row that FAILED as poison."""

    status: Status
    attempt: int
    lease_expires_at_ms: int | None
    fail_class: FailClass | None = None
    lease_owner: str | None = None
    life_began: int = 0
    failed_with: str | None = None


@dataclass(frozen=True, slots=True)
class ReleaseNote:
    """A stopping executor's note (in Redis) that it released the run at `attempt` (the
    fencing token), as its lease owner `owner`, while the store could not take the release.
    `lost_end`: for a run that ended but whose end the store did not take, that end's reason
    (`completed`, `retriable_error`, ...); the run is handed back all the same, its end being
    written nowhere. None for a run cut short."""

    attempt: int
    owner: str
    lost_end: str | None = None


@dataclass(frozen=True, slots=True)
class EntryFacts:
    """What Redis says about the entry. `attempt` is None when the entry does not decode;
    `owner_alive` is whether `consumer` (whose pending list holds it) is alive;
    `owner_losses` how many earlier runs of this instance already lost their owner (since
    its last manual requeue);
    `earlier_deliveries` how often the entries this one replaced (`Action.REDELIVER`) were
    delivered, so that consumers dying before their claim are counted too;
    `released` the release noted for the row's attempt, if any."""

    attempt: int | None
    deliveries: int
    owner_alive: bool
    owner_losses: int = 0
    idle_ms: int = 0
    consumer: str | None = None
    earlier_deliveries: int = 0
    released: ReleaseNote | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reason: str


def decide(
    entry: EntryFacts,
    row: RowFacts | None,
    *,
    db_now_ms: int,
    max_deliveries: int,
    unclaimed_ms: int = 30_000,
) -> Verdict:
    """The action for one pending entry; see `Action` for each outcome. An entry its live
    owner has not claimed within `unclaimed_ms` (the claim failed, the store was down) is
    delivered again.

    Only an entry for the attempt in progress can be poison, and only when nobody is running
    it: a run whose owner is alive and holds its lease is left alone whatever the delivery
    count, and so is a duplicate delivery of it in another consumer's list (acked)."""
    early = _gate(entry, row)
    if early is not None or row is None or entry.attempt is None:
        return early or Verdict(Action.DEAD_LETTER, "unknown_instance")
    if row.status is Status.RUNNING and row.attempt == entry.attempt + 1:
        return _running(entry, row, db_now_ms, max_deliveries)
    if row.status in AWAITING_CLAIM and row.attempt == entry.attempt:
        return _awaiting_claim(entry, max_deliveries, unclaimed_ms)
    if row.status is Status.TIMEOUT and row.attempt == entry.attempt + 1:
        # The run's move into TIMEOUT landed, the move out of it did not (the store failed
        # between the two, or the first one's reply was lost): finish it from the entry, which
        # then goes where that move sends it (acked, or dead-lettered when poison).
        return Verdict(Action.TIMEOUT, LEFT_IN_TIMEOUT)
    if row.attempt > entry.attempt:
        return Verdict(Action.ACK, "entry of an older attempt")
    # An entry is made from its row at the entry's attempt, which only grows, and the row is
    # read after the entry: none can be ahead of it, nor RUNNING or TIMEOUT at its attempt
    # (the claim moved it on). Only a store restored from an older backup shows one. The
    # store is the truth: the entry is no run of it, and left pending it would hide the row
    # from the reconciler, which republishes the row's own attempt once it is acked.
    return Verdict(Action.ACK, f"entry of an attempt the store never made ({row.status})")


def poison_reason(failed_with: str | None) -> str:
    """The dead-letter reason of an entry whose instance already FAILED as poison (its mover
    failed before moving the entry), given the reason recorded with that move to FAILED: the
    reason its mover would have dead-lettered it with (`unknown_agent`, `payload_too_large`),
    so the letter says what the history says; `poison` for the moves of recovery
    (`after_owner_lost`, ...) and of the sweeper itself, or when none is known."""
    if failed_with is None or failed_with.startswith(AFTER):
        return "poison"
    return failed_with


def liveness_trusted(redis_failed_ms: int | None, *, now_ms: int, ttl_ms: int) -> bool:
    """Whether an absent liveness key means a lost consumer: not within one TTL (`ttl_ms`)
    after Redis failed at `redis_failed_ms` (every key may have expired in the outage)."""
    return redis_failed_ms is None or now_ms - redis_failed_ms >= ttl_ms


def owners_lost(
    absent_since: Mapping[str, int], alive: Mapping[str, bool], *, now_ms: int, ttl_ms: int
) -> tuple[dict[str, int], set[str]]:
    """Which owners of runs whose entries are gone count as lost. `alive` is this pass's
    reading of their liveness keys, `absent_since` (owner -> ms) the previous pass's result.
    An owner is lost once its key has been absent at two readings at least one TTL (`ttl_ms`)
    apart: one absent reading may be a Redis emptied moments ago (a live executor sets its
    key again within a TTL). Returns the new `absent_since` (only the owners read now) and
    the lost owners."""
    since = {o: absent_since.get(o, now_ms) for o, up in alive.items() if not up}
    return since, {o for o, t in since.items() if now_ms - t >= ttl_ms}


def _gate(entry: EntryFacts, row: RowFacts | None) -> Verdict | None:
    """Verdicts that do not depend on the run's state."""
    if entry.attempt is None:
        return Verdict(Action.DEAD_LETTER, "undecodable")
    if row is None:
        return Verdict(Action.DEAD_LETTER, "unknown_instance")
    if row.status in SETTLED:
        if poisoned_by(
            entry.attempt, row.status, row.fail_class, row.attempt, life_began=row.life_began
        ):
            # Failed as poison, but the move to the dead-letter stream did not happen (Redis
            # failed after the store's commit): the entry still belongs there. One from before
            # a requeue is acked, as every entry of a failure the requeue took back is.
            return Verdict(Action.DEAD_LETTER, poison_reason(row.failed_with))
        return Verdict(Action.ACK, f"instance is {row.status}")
    return None


def _crashes(entry: EntryFacts, max_deliveries: int) -> Verdict | None:
    """POISON when too many deliveries ended without an outcome: this entry's, those of the
    entries it replaced, and the earlier runs that lost their owner (each through an entry of
    its own, so none is counted twice)."""
    crashes = entry.deliveries + entry.earlier_deliveries + entry.owner_losses
    if crashes > max_deliveries:
        return Verdict(Action.POISON, f"{crashes} deliveries > {max_deliveries}")
    return None


def _awaiting_claim(entry: EntryFacts, max_deliveries: int, unclaimed_ms: int) -> Verdict:
    if entry.owner_alive and entry.idle_ms < unclaimed_ms:
        # The live owner's delivery has not ended: it is no crash (yet), whatever came before
        # it, and the claim may still land.
        return Verdict(Action.LEAVE, "owner alive, claim pending")
    poison = _crashes(entry, max_deliveries)
    if poison is not None:
        return poison
    if not entry.owner_alive:
        return Verdict(Action.REDELIVER, "owner gone before claiming")
    return Verdict(Action.REDELIVER, "owner never claimed it")


def _running(entry: EntryFacts, row: RowFacts, db_now_ms: int, max_deliveries: int) -> Verdict:
    owner = row.lease_owner
    if entry.consumer is not None and owner is not None and entry.consumer != owner:
        # A second delivery of the attempt that lost its claim: the run is `owner`'s, and its
        # own entry is in `owner`'s list (or, if lost, the reconciler times the run out).
        return Verdict(Action.ACK, "duplicate of a run another consumer holds")
    expired = row.lease_expires_at_ms is None or row.lease_expires_at_ms <= db_now_ms
    if entry.owner_alive and not expired:
        return Verdict(Action.LEAVE, "owner alive, lease held")
    if _released_by_owner(entry.released, row):
        # Handed back, not lost: no crash to count, and no attempt spent.
        return Verdict(Action.RELEASE, RELEASED)
    poison = _crashes(entry, max_deliveries)
    if poison is not None:
        return poison
    return Verdict(Action.TIMEOUT, OWNER_LOST if not entry.owner_alive else LEASE_EXPIRED)


def _released_by_owner(note: ReleaseNote | None, row: RowFacts) -> bool:
    """The note is the release of the run the row holds: its attempt and its lease owner."""
    return note is not None and note.attempt == row.attempt and note.owner == row.lease_owner
