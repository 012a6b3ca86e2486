"""`taskstream status` counts a group's consumers and says how many of them are gone."""

from __future__ import annotations

from taskstream.cli.query_cmds import _consumers_text


def test_consumers_without_a_liveness_key_are_counted_as_gone() -> None:
    live, dead = {"name": "a", "alive": True}, {"name": "b", "alive": False}
    assert _consumers_text([]) == "0"
    assert _consumers_text([live, live]) == "2"
    assert _consumers_text([live, dead, dead]) == "3 (2 gone)"
