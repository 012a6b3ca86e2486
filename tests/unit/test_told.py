"""`Told`: a row is named once per reason, again when the reason changes or after it was
forgotten (fine again), and only the newest rows are remembered."""

from __future__ import annotations

from taskstream.core import told
from taskstream.core.told import Told


def test_a_row_is_told_once_per_reason() -> None:
    t = Told()
    assert t.first_time("a", "bad json")
    assert not t.first_time("a", "bad json")
    assert t.first_time("a", "bad status")
    t.forget("a")
    assert t.first_time("a", "bad status")


def test_only_the_newest_rows_are_remembered() -> None:
    t = Told()
    for i in range(told.TOLD_MAX + 1):
        assert t.first_time(f"r{i}", "x")
    assert t.first_time("r0", "x")  # the oldest was let go
    assert not t.first_time(f"r{told.TOLD_MAX}", "x")
