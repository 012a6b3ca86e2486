"""Payloads from outside: strict JSON objects, and the size limit as the executor measures it."""

from __future__ import annotations

import pytest

from taskstream.core.payloads import parse_json_object, payload_problem

LIMIT = 1024


def test_the_size_is_utf8_bytes_of_the_compact_sorted_json() -> None:
    payload = {"b": "é" * 10, "a": [1, 2]}  # {"a":[1,2],"b":"éééééééééé"}: 28 chars, 38 bytes
    assert payload_problem(payload, 38) is None
    assert payload_problem(payload, 37) == (
        "38 bytes as stored JSON, over the limit of 37 bytes (TASKSTREAM_MAX_PAYLOAD_BYTES)"
    )


def test_a_lone_surrogate_is_a_problem_not_an_exception() -> None:
    assert payload_problem({"a": "\ud800"}, LIMIT) == (
        "holds the lone surrogate '\\ud800', which is not Unicode text"
    )
    assert payload_problem({"a": "ok"}, LIMIT) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1, "a": 2}', 'duplicate key "a": a JSON object may name each key once'),
        ('{"a": {"b": 1, "b": 1}}', 'duplicate key "b": a JSON object may name each key once'),
        ('{"a": NaN}', "not valid JSON: NaN is not a JSON number"),
        ('{"a": 1e999}', "not valid JSON: 1e999 is too large for a JSON number"),
        ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "not valid JSON: nested too deeply"),
        ("[1]", "must be a JSON object ({...})"),
    ],
)
def test_parse_json_object_refuses(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_json_object(text)
    assert str(caught.value) == expected


def test_a_number_json_cannot_hold_is_a_problem_not_an_exception() -> None:
    """As a task file's YAML can give (`.inf`)."""
    problem = payload_problem({"a": float("inf")}, LIMIT) or ""
    assert problem.startswith("holds a value JSON cannot hold: Out of range float values")


def test_parse_json_object_keeps_distinct_keys() -> None:
    assert parse_json_object('{"a": 1, "b": {"a": 2}}') == {"a": 1, "b": {"a": 2}}
