"""The rule that tells a tick's own unrecorded instance from a duplicate (pure)."""

from __future__ import annotations

from taskstream.scheduler.emit import unrecorded_own


def test_only_a_scheduled_instance_no_decision_names_is_the_ticks_own() -> None:
    assert unrecorded_own("scheduled", [], "i1")
    assert unrecorded_own("scheduled", [None, "i0"], "i1")
    assert not unrecorded_own("scheduled", ["i1"], "i1")
    assert not unrecorded_own("backfill", [], "i1")
    assert not unrecorded_own("manual", [None], "i1")
