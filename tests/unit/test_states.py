"""The state table, walked whole."""

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
