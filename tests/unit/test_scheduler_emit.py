"""The rule that tells a tick's own unrecorded instance from a duplicate (pure)."""

from __future__ import annotations

from taskstream.scheduler.emit import unrecorded_own

FIRE = 3_600_000


def test_only_a_scheduled_instance_no_decision_names_is_the_ticks_own() -> None:
    assert unrecorded_own("scheduled", [], "i1", FIRE, FIRE)
    assert unrecorded_own("scheduled", [None, "i0"], "i1", FIRE, FIRE)
    assert not unrecorded_own("scheduled", ["i1"], "i1", FIRE, FIRE)
    assert not unrecorded_own("backfill", [], "i1", FIRE, FIRE)
    assert not unrecorded_own("manual", [None], "i1", FIRE, FIRE)


def test_an_earlier_ticks_instance_under_a_shared_key_is_a_duplicate() -> None:
    # `{business_date}`: the 01:00 tick made the day's instance; the 02:00 tick finds it.
    assert not unrecorded_own("scheduled", [], "i1", FIRE, 2 * FIRE)
