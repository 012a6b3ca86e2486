"""The supervisor's restart delays, as docs/operations.md states them."""

from __future__ import annotations

from taskstream.runtime.supervisor import restart_delay_s


def test_a_child_that_keeps_exiting_waits_1_2_4_8_then_16_seconds() -> None:
    assert [restart_delay_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 16, 16, 16]
    assert restart_delay_s(10**9) == 16
