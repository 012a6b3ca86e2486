"""The record of a missed fire time has its own dedupe key, `missed:` + the tick's, within the
column's length however long the tick's key is, and never shared by two ticks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.spec import MAX_DEDUPE_KEY_LEN
from taskstream.core.specfile import parse_task_file_text
from taskstream.scheduler.emit import missed_instance, missed_key
from taskstream.scheduler.instances import new_instance, tick_instance_id

HOUR_MS = 3_600_000
T0 = 1_780_000_000_000 - 1_780_000_000_000 % HOUR_MS


def test_a_short_key_is_only_prefixed() -> None:
    assert missed_key("report:2026-01-01") == "missed:report:2026-01-01"


def test_ticks_whose_long_keys_differ_only_at_the_end_get_two_records() -> None:
    """A key of the longest length allowed (230 + 1 + 24 characters) ends in the fire time,
    whose seconds are in its last 7 characters: two ticks a second apart get two records."""
    text = (
        "tasks:\n  - id: long\n    agent: echo\n    schedule: {every: 1s}\n"
        f'    dedupe_key: "{"x" * 230}:{{scheduled_for}}"\n'
    )
    [spec] = parse_task_file_text(text, "t.yaml").tasks
    first, second = missed_instance(spec, T0), missed_instance(spec, T0 + 1000)
    assert first.dedupe_key != second.dedupe_key and first.id != second.id
    assert all(len(r.dedupe_key) <= MAX_DEDUPE_KEY_LEN for r in (first, second))
    assert first.dedupe_key.startswith("missed:xxx")


@given(st.text(min_size=1, max_size=MAX_DEDUPE_KEY_LEN), st.text(max_size=MAX_DEDUPE_KEY_LEN))
def test_distinct_keys_never_share_a_missed_key(a: str, b: str) -> None:
    if a != b:
        assert missed_key(a) != missed_key(b)
    assert len(missed_key(a)) <= MAX_DEDUPE_KEY_LEN and missed_key(a).startswith("missed:")


def test_the_tick_instance_id_is_the_id_of_the_row_a_pass_makes() -> None:
    text = (
        "tasks:\n  - id: t\n    agent: echo\n    schedule: {every: 1s}\n"
        '    dedupe_key: "{task_id}:{payload.region}:{scheduled_for}"\n    payload: {region: eu}\n'
    )
    [spec] = parse_task_file_text(text, "t.yaml").tasks
    assert tick_instance_id(spec, T0) == new_instance(spec, T0).id
