"""The sweep decision from a table of facts."""

from __future__ import annotations

import pytest

from taskstream.core.states import FailClass, Status
from taskstream.executor.sweep import (
    Action,
    EntryFacts,
    ReleaseNote,
    RowFacts,
    decide,
    poison_reason,
)

NOW = 1_000_000


def row(
    status: Status,
    attempt: int,
    lease: int | None = None,
    fail: FailClass | None = None,
    began: int = 0,
) -> RowFacts:
    return RowFacts(
        status=status, attempt=attempt, lease_expires_at_ms=lease, fail_class=fail, life_began=began
    )


POISON = FailClass.POISON


@pytest.mark.parametrize(
    ("entry", "facts", "action"),
    [
        (EntryFacts(None, 1, True), row(Status.RUNNING, 1, NOW + 1), Action.DEAD_LETTER),
        (EntryFacts(0, 1, True), None, Action.DEAD_LETTER),
        (EntryFacts(0, 1, False), row(Status.SUCCESS, 1), Action.ACK),
        (EntryFacts(0, 1, False), row(Status.FAILED, 1), Action.ACK),
        (EntryFacts(0, 1, False), row(Status.FAILED, 1, fail=FailClass.FATAL), Action.ACK),
        # Failed as poison by this entry (its run, or unclaimed: an unknown agent), and still
        # pending: the move to the dead-letter stream is owed.
        (EntryFacts(0, 1, True), row(Status.FAILED, 1, fail=POISON), Action.DEAD_LETTER),
        (EntryFacts(0, 1, True), row(Status.FAILED, 0, fail=POISON), Action.DEAD_LETTER),
        (EntryFacts(0, 1, False), row(Status.FAILED, 3, fail=POISON), Action.ACK),
        # A requeue moved the row from attempt 0 to 1 (a new life), whose own entry failed as
        # poison unclaimed: an entry of attempt 0 started no run of it, and owes no letter.
        (EntryFacts(0, 1, False), row(Status.FAILED, 1, fail=POISON, began=1), Action.ACK),
        (EntryFacts(1, 1, False), row(Status.FAILED, 1, fail=POISON, began=1), Action.DEAD_LETTER),
        (EntryFacts(1, 1, False), row(Status.FAILED, 2, fail=POISON, began=1), Action.DEAD_LETTER),
        (EntryFacts(0, 1, True), row(Status.RUNNING, 1, NOW + 1), Action.LEAVE),
        (EntryFacts(0, 1, True), row(Status.RUNNING, 1, NOW), Action.TIMEOUT),
        (EntryFacts(0, 1, False), row(Status.RUNNING, 1, NOW + 10_000), Action.TIMEOUT),
        (EntryFacts(0, 1, True), row(Status.DISPATCHED, 0), Action.LEAVE),
        (EntryFacts(0, 1, False), row(Status.DISPATCHED, 0), Action.REDELIVER),
        (EntryFacts(0, 1, True, idle_ms=30_000), row(Status.DISPATCHED, 0), Action.REDELIVER),
        (EntryFacts(0, 2, False), row(Status.RETRYING, 1), Action.ACK),
        # PENDING / RETRYING at the entry's attempt: the outbox's CAS did not happen; an
        # entry whose consumer is gone is delivered again, not left forever.
        (EntryFacts(1, 1, False), row(Status.RETRYING, 1), Action.REDELIVER),
        (EntryFacts(0, 1, False), row(Status.PENDING, 0), Action.REDELIVER),
        (EntryFacts(0, 1, True), row(Status.PENDING, 0), Action.LEAVE),
        (EntryFacts(0, 6, False), row(Status.PENDING, 0), Action.POISON),
        # A delivery its live owner may still claim has not ended: it is not counted yet.
        (EntryFacts(3, 1, True, owner_losses=5), row(Status.DISPATCHED, 3), Action.LEAVE),
        (EntryFacts(0, 6, True), row(Status.DISPATCHED, 0), Action.LEAVE),
        (
            EntryFacts(3, 1, True, owner_losses=5, idle_ms=30_000),
            row(Status.DISPATCHED, 3),
            Action.POISON,
        ),
        # Deliveries of the entries this one replaced count: consumers that died unclaimed.
        (
            EntryFacts(0, 1, False, earlier_deliveries=4),
            row(Status.DISPATCHED, 0),
            Action.REDELIVER,
        ),
        (EntryFacts(0, 1, False, earlier_deliveries=5), row(Status.DISPATCHED, 0), Action.POISON),
        (
            EntryFacts(0, 1, True, earlier_deliveries=9),
            row(Status.RUNNING, 1, NOW + 1),
            Action.LEAVE,
        ),
        (EntryFacts(0, 1, False, earlier_deliveries=5), row(Status.RUNNING, 1), Action.POISON),
        # A live run is never poison, however often its entry was read.
        (EntryFacts(0, 6, True), row(Status.RUNNING, 1, NOW + 1), Action.LEAVE),
        (EntryFacts(0, 6, True), row(Status.RUNNING, 1, NOW), Action.POISON),
        (EntryFacts(0, 6, False), row(Status.RUNNING, 1, NOW + 1), Action.POISON),
        # A stale entry is acked, never poison for the newer attempt.
        (EntryFacts(0, 9, False), row(Status.RETRYING, 2), Action.ACK),
        (EntryFacts(0, 9, False), row(Status.RUNNING, 3, NOW + 1), Action.ACK),
        (EntryFacts(3, 1, False, owner_losses=5), row(Status.RUNNING, 4, NOW + 1), Action.POISON),
        (EntryFacts(3, 1, False, owner_losses=4), row(Status.RUNNING, 4, NOW + 1), Action.TIMEOUT),
        # A run whose move into TIMEOUT landed but not the move out of it: finished from its
        # entry. An entry of an older attempt is acked.
        (EntryFacts(3, 1, True), row(Status.TIMEOUT, 4), Action.TIMEOUT),
        (EntryFacts(2, 1, False), row(Status.TIMEOUT, 4), Action.ACK),
        # An entry ahead of its row (a store restored from an older backup) is no run of it.
        (EntryFacts(2, 1, False), row(Status.DISPATCHED, 0), Action.ACK),
        (EntryFacts(2, 1, True), row(Status.RETRYING, 1), Action.ACK),
        (EntryFacts(1, 1, False), row(Status.RUNNING, 1, NOW + 1), Action.ACK),
        (EntryFacts(1, 1, False), row(Status.TIMEOUT, 1), Action.ACK),
        # Every delivery that ended without an outcome counts once, whichever its kind.
        (
            EntryFacts(4, 1, False, owner_losses=2, earlier_deliveries=2),
            row(Status.RETRYING, 4),
            Action.REDELIVER,
        ),
        (
            EntryFacts(4, 1, False, owner_losses=3, earlier_deliveries=2),
            row(Status.DISPATCHED, 4),
            Action.POISON,
        ),
        (
            EntryFacts(3, 1, False, owner_losses=2, earlier_deliveries=3),
            row(Status.RUNNING, 4, NOW + 1),
            Action.POISON,
        ),
    ],
)
def test_table(entry: EntryFacts, facts: RowFacts | None, action: Action) -> None:
    assert decide(entry, facts, db_now_ms=NOW, max_deliveries=5).action is action


def test_a_duplicate_in_a_dead_consumers_list_does_not_end_the_run_it_duplicates() -> None:
    """The run is `a`'s (alive or not); `b` read a second entry of the same attempt, lost the
    claim and is gone: that entry is acked, the run left to `a`'s own entry."""
    running = RowFacts(Status.RUNNING, 1, NOW + 60_000, lease_owner="a")
    for alive in (True, False):
        duplicate = EntryFacts(0, 1, alive, consumer="b")
        verdict = decide(duplicate, running, db_now_ms=NOW, max_deliveries=5)
        assert (verdict.action, verdict.reason) == (
            Action.ACK,
            "duplicate of a run another consumer holds",
        )
    own = EntryFacts(0, 1, False, consumer="a")
    assert decide(own, running, db_now_ms=NOW, max_deliveries=5).action is Action.TIMEOUT


HELD_BY_A = RowFacts(Status.RUNNING, 3, NOW + 60_000, lease_owner="a")
EXPIRED_A = RowFacts(Status.RUNNING, 3, NOW, lease_owner="a")


@pytest.mark.parametrize(
    ("entry", "facts", "action"),
    [
        # Its owner stopped and noted the release the store did not take: released, not
        # timed out, and not counted as a crash however often the entry was delivered.
        (EntryFacts(2, 1, False, released=ReleaseNote(3, "a")), HELD_BY_A, Action.RELEASE),
        (EntryFacts(2, 5, False, released=ReleaseNote(3, "a")), HELD_BY_A, Action.RELEASE),
        (EntryFacts(2, 1, True, released=ReleaseNote(3, "a")), EXPIRED_A, Action.RELEASE),
        # A note of another attempt or another owner is not this run's release.
        (EntryFacts(2, 1, False, released=ReleaseNote(2, "a")), HELD_BY_A, Action.TIMEOUT),
        (EntryFacts(2, 1, False, released=ReleaseNote(3, "b")), HELD_BY_A, Action.TIMEOUT),
        (EntryFacts(2, 9, False, released=ReleaseNote(3, "b")), HELD_BY_A, Action.POISON),
        # A live owner holding its lease keeps the run, note or not.
        (EntryFacts(2, 1, True, released=ReleaseNote(3, "a")), HELD_BY_A, Action.LEAVE),
        # The entry of an older attempt is acked; the run is another entry's.
        (EntryFacts(1, 1, False, released=ReleaseNote(3, "a")), HELD_BY_A, Action.ACK),
    ],
)
def test_a_noted_release_of_the_rows_run_is_made(
    entry: EntryFacts, facts: RowFacts, action: Action
) -> None:
    assert decide(entry, facts, db_now_ms=NOW, max_deliveries=5).action is action


def test_a_note_does_not_release_a_row_without_a_lease_owner() -> None:
    ownerless = RowFacts(Status.RUNNING, 3, NOW, lease_owner=None)
    entry = EntryFacts(2, 1, False, released=ReleaseNote(3, "a"))
    assert decide(entry, ownerless, db_now_ms=NOW, max_deliveries=5).action is Action.TIMEOUT


def test_settled_wins_over_delivery_count() -> None:
    verdict = decide(
        EntryFacts(0, 99, False), row(Status.SUCCESS, 1), db_now_ms=NOW, max_deliveries=5
    )
    assert verdict.action is Action.ACK


def test_liveness_is_trusted_again_one_ttl_after_redis_failed() -> None:
    from taskstream.executor.sweep import liveness_trusted

    assert liveness_trusted(None, now_ms=NOW, ttl_ms=6_000)
    assert not liveness_trusted(NOW - 5_999, now_ms=NOW, ttl_ms=6_000)
    assert liveness_trusted(NOW - 6_000, now_ms=NOW, ttl_ms=6_000)


def test_an_owner_is_lost_once_absent_at_two_readings_a_ttl_apart() -> None:
    from taskstream.executor.sweep import owners_lost

    since, lost = owners_lost({}, {"a": False, "b": True}, now_ms=NOW, ttl_ms=6_000)
    assert (since, lost) == ({"a": NOW}, set())
    since, lost = owners_lost(since, {"a": False}, now_ms=NOW + 5_999, ttl_ms=6_000)
    assert (since, lost) == ({"a": NOW}, set())
    since, lost = owners_lost(since, {"a": False}, now_ms=NOW + 6_000, ttl_ms=6_000)
    assert (since, lost) == ({"a": NOW}, {"a"})


def test_an_owner_seen_alive_or_not_read_starts_its_absence_again() -> None:
    from taskstream.executor.sweep import owners_lost

    since = {"a": NOW, "b": NOW}
    again, lost = owners_lost(since, {"a": True}, now_ms=NOW + 10_000, ttl_ms=6_000)
    assert (again, lost) == ({}, set())  # a came back (Redis emptied), b was not read
    again, lost = owners_lost(again, {"a": False}, now_ms=NOW + 11_000, ttl_ms=6_000)
    assert (again, lost) == ({"a": NOW + 11_000}, set())


@pytest.mark.parametrize(
    ("failed_with", "reason"),
    [
        ("unknown_agent", "unknown_agent"),
        ("payload_too_large", "payload_too_large"),
        ("poison", "poison"),
        ("after_owner_lost", "poison"),
        ("after_lease_expired", "poison"),
        (None, "poison"),
    ],
)
def test_a_finished_poison_move_keeps_its_movers_reason(
    failed_with: str | None, reason: str
) -> None:
    assert poison_reason(failed_with) == reason


@pytest.mark.parametrize(
    ("failed_with", "reason"),
    [("unknown_agent", "unknown_agent"), ("after_owner_lost", "poison"), (None, "poison")],
)
def test_an_owed_letter_carries_the_reason_of_the_move_to_failed(
    failed_with: str | None, reason: str
) -> None:
    facts = RowFacts(Status.FAILED, 1, None, fail_class=POISON, failed_with=failed_with)
    verdict = decide(EntryFacts(1, 1, False), facts, db_now_ms=NOW, max_deliveries=3)
    assert (verdict.action, verdict.reason) == (Action.DEAD_LETTER, reason)
