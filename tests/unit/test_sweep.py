"""The sweep decision from a table of facts."""

from __future__ import annotations

import pytest

from taskstream.core.states import FailClass, Status
from taskstream.executor.sweep import Action, EntryFacts, RowFacts, decide

NOW = 1_000_000


def row(
    status: Status, attempt: int, lease: int | None = None, fail: FailClass | None = None
) -> RowFacts:
    return RowFacts(status=status, attempt=attempt, lease_expires_at_ms=lease, fail_class=fail)


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
        (EntryFacts(0, 1, True), row(Status.RUNNING, 1, NOW + 1), Action.LEAVE),
        (EntryFacts(0, 1, True), row(Status.RUNNING, 1, NOW), Action.TIMEOUT),
        (EntryFacts(0, 1, False), row(Status.RUNNING, 1, NOW + 10_000), Action.TIMEOUT),
        (EntryFacts(0, 1, True), row(Status.DISPATCHED, 0), Action.LEAVE),
        (EntryFacts(0, 1, False), row(Status.DISPATCHED, 0), Action.REDELIVER),
        (EntryFacts(0, 1, True, idle_ms=30_000), row(Status.DISPATCHED, 0), Action.REDELIVER),
        (EntryFacts(0, 2, False), row(Status.RETRYING, 1), Action.ACK),
        (EntryFacts(1, 1, False), row(Status.RETRYING, 1), Action.LEAVE),
        (EntryFacts(0, 6, True), row(Status.RUNNING, 1, NOW + 1), Action.POISON),
        (EntryFacts(3, 1, False, owner_losses=5), row(Status.RUNNING, 4, NOW + 1), Action.POISON),
        (EntryFacts(3, 1, False, owner_losses=4), row(Status.RUNNING, 4, NOW + 1), Action.TIMEOUT),
    ],
)
def test_table(entry: EntryFacts, facts: RowFacts | None, action: Action) -> None:
    assert decide(entry, facts, db_now_ms=NOW, max_deliveries=5).action is action


def test_settled_wins_over_delivery_count() -> None:
    verdict = decide(
        EntryFacts(0, 99, False), row(Status.SUCCESS, 1), db_now_ms=NOW, max_deliveries=5
    )
    assert verdict.action is Action.ACK
