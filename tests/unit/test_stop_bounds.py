"""How long a stop takes: the executor's grace counts from its stop, and `up` kills a child
only once an executor's steps before its drain, its grace and its last writes can be over."""

from __future__ import annotations

from taskstream.core.futures import CANCEL_WAIT_S, STEP_END_S
from taskstream.executor.handover import grace_left_s
from taskstream.runtime.supervisor import KILL_MARGIN_S, STOP_STEPS_S, kill_after_s


def test_the_grace_counts_from_the_stop() -> None:
    assert grace_left_s(8.0, None, 100.0) == 8.0
    assert grace_left_s(8.0, 100.0, 100.0) == 8.0
    assert grace_left_s(8.0, 100.0, 103.0) == 5.0
    assert grace_left_s(1.0, 100.0, 103.0) == 0.0
    assert grace_left_s(8.0, 100.0, 99.0) == 8.0  # a clock read before the stop's


def test_up_waits_for_the_executors_steps_before_its_drain_as_well_as_the_grace() -> None:
    assert STOP_STEPS_S == 2 * STEP_END_S + CANCEL_WAIT_S
    assert kill_after_s(8.0) == 8.0 + KILL_MARGIN_S  # the default grace: 10 s, as before
    assert kill_after_s(1.0) == STOP_STEPS_S + KILL_MARGIN_S
    assert kill_after_s(0.0) == STOP_STEPS_S + KILL_MARGIN_S
