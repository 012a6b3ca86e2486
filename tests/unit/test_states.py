"""The state table, walked whole, and which entry an instance FAILED as poison by."""

from __future__ import annotations

import itertools

import pytest

from taskstream.core.errors import InvalidTransition
from taskstream.core.states import (
    SETTLED,
    TERMINAL,
    TRANSITIONS,
    FailClass,
    Status,
    can_transition,
    check_transition,
    last_failure,
    life_began,
    poisoned_by,
)

ALLOWED = {
    ("PENDING", "DISPATCHED"),
    ("PENDING", "SKIPPED"),
    ("DISPATCHED", "RUNNING"),
    ("DISPATCHED", "TIMEOUT"),
    ("DISPATCHED", "FAILED"),
    ("RUNNING", "SUCCESS"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "RETRYING"),
    ("RUNNING", "TIMEOUT"),
    ("RETRYING", "DISPATCHED"),
    ("RETRYING", "FAILED"),
    ("TIMEOUT", "RETRYING"),
    ("TIMEOUT", "FAILED"),
    ("FAILED", "PENDING"),
}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(Status, Status)))
def test_every_pair_matches_the_design_table(src: Status, dst: Status) -> None:
    expected = (src.value, dst.value) in ALLOWED
    assert can_transition(src, dst) is expected
    fail_class = FailClass.FATAL if dst is Status.FAILED else None
    if expected:
        check_transition(src, dst, fail_class=fail_class)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(src, dst, fail_class=fail_class)


def test_terminal_states_have_no_exit() -> None:
    assert {Status.SUCCESS, Status.SKIPPED} == TERMINAL
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert Status.FAILED in SETTLED


def test_failed_requires_a_fail_class_and_nothing_else_takes_one() -> None:
    with pytest.raises(InvalidTransition):
        check_transition(Status.RUNNING, Status.FAILED)
    with pytest.raises(InvalidTransition):
        check_transition(Status.RUNNING, Status.SUCCESS, fail_class=FailClass.FATAL)


POISON = FailClass.POISON


@pytest.mark.parametrize(
    ("entry_attempt", "status", "fail_class", "attempt", "began", "expected"),
    [
        # Unclaimed (the entry's own attempt), or in the run the entry started (+1).
        (0, Status.FAILED, POISON, 0, 0, True),
        (0, Status.FAILED, POISON, 1, 0, True),
        (0, Status.FAILED, POISON, 2, 0, False),
        (1, Status.FAILED, POISON, 0, 0, False),
        # Not poison, or not failed at all.
        (0, Status.FAILED, FailClass.FATAL, 1, 0, False),
        (0, Status.RUNNING, None, 1, 0, False),
        # A requeue moved the FAILED row from attempt 0 to 1, and the new life's own entry
        # failed as poison unclaimed: attempt 1 is no run the entry of attempt 0 started.
        (0, Status.FAILED, POISON, 1, 1, False),
        (1, Status.FAILED, POISON, 1, 1, True),
        (1, Status.FAILED, POISON, 2, 1, True),
        (3, Status.FAILED, POISON, 4, 1, True),
    ],
)
def test_poisoned_by_tells_the_run_an_entry_started_from_a_later_life(
    entry_attempt: int,
    status: Status,
    fail_class: FailClass | None,
    attempt: int,
    began: int,
    expected: bool,
) -> None:
    assert poisoned_by(entry_attempt, status, fail_class, attempt, life_began=began) is expected


@pytest.mark.parametrize(
    ("history", "began"),
    [
        ([], 0),
        ([("created", 0), ("published", 0), ("claimed", 1), ("failed", 1)], 0),
        ([("claimed", 1), ("poison", 1), ("requeued", 2), ("claimed", 3)], 2),
        ([("unknown_agent", 0), ("requeued", 1), ("unknown_agent", 1), ("requeued", 2)], 2),
    ],
)
def test_a_life_begins_at_the_last_requeue(history: list[tuple[str, int]], began: int) -> None:
    assert life_began(history) == began


def test_last_failure_is_the_reason_of_the_last_move_to_failed() -> None:
    moves = [
        (Status.FAILED, "unknown_agent"),
        (Status.PENDING, "requeued"),
        (Status.FAILED, "after_owner_lost"),
        (Status.PENDING, "requeued"),
    ]
    assert last_failure(moves) == "after_owner_lost"
    assert last_failure([(Status.SUCCESS, "completed")]) is None
