"""`taskstream mark` warns when no stored task waits for the marker it sets."""

from __future__ import annotations

from taskstream.core.definitions import unwaited_marker, valid_specs
from taskstream.core.spec import TaskSpec
from taskstream.core.store.port import DefinitionRecord


def spec(task_id: str, *markers: str) -> TaskSpec:
    return TaskSpec.model_validate({"id": task_id, "agent": "echo", "depends_on": list(markers)})


SPECS = [spec("load", "raw.ready"), spec("report", "raw.ready", "fx.ready"), spec("free")]


def test_a_marker_some_task_waits_for_needs_no_word() -> None:
    assert unwaited_marker("fx.ready", SPECS) is None


def test_a_misspelt_marker_is_named_with_those_tasks_wait_for() -> None:
    assert unwaited_marker("raw.redy", SPECS) == (
        "no stored task depends on 'raw.redy' (markers tasks wait for: fx.ready, raw.ready)"
    )


def test_with_no_dependencies_anywhere_the_list_says_none() -> None:
    assert unwaited_marker("raw.ready", [spec("free")]) == (
        "no stored task depends on 'raw.ready' (markers tasks wait for: none)"
    )


def test_definitions_that_no_longer_load_are_left_out() -> None:
    good = DefinitionRecord(task_id="load", spec=SPECS[0].model_dump(mode="json"), spec_hash="h")
    bad = DefinitionRecord(
        task_id="old", spec={"id": "old", "agent": "echo", "x": 1}, spec_hash="h"
    )
    assert [s.id for s in valid_specs([good, bad])] == ["load"]
