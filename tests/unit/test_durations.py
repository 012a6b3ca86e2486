"""Duration parsing: numbers and compact strings to float seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from taskstream.core.durations import Duration, PositiveDuration, parse_duration
from taskstream.core.errors import ConfigError
from taskstream.core.specfile import parse_task_file_text


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (1.5, 1.5),
        ("30", 30.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2d", 172_800.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("1d 2h", 93_600.0),
        (" 10s ", 10.0),
        ("1m30s500ms", 90.5),
        ("10S", 10.0),
    ],
)
def test_accepted_forms(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (-1, "must not be negative"),
        ("-5s", "must not be negative"),
        ("", "empty"),
        ("   ", "empty"),
        ("5y", "unknown unit 'y'"),
        ("1h30", "30 has no unit (use d, h, m, s, ms, e.g. 1h30m; only a lone number is seconds)"),
        ("1.5.2h", "1.5 has no unit"),
        ("1h1h", "largest first"),
        ("30m1h", "largest first"),
        ("abc", "cannot read 'abc'"),
        ("10s!", "cannot read '!'"),
        (True, "expected seconds"),
        (None, "expected seconds"),
        ([10], "expected seconds"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
    ],
)
def test_rejected_forms_name_the_bad_text(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match="invalid duration") as caught:
        parse_duration(value)
    message = str(caught.value)
    assert reason in message
    assert repr(value) in message


def test_an_integer_beyond_any_float_is_too_large_not_an_overflow() -> None:
    with pytest.raises(ValueError, match="invalid duration: the number is too large"):
        parse_duration(10**400)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tasks:\n  - id: a\n    agent: echo\n    timeout: {n}\n", "task 'a': timeout:"),
        ("upstreams:\n  api: {{limit: 1, window: {n}}}\ntasks: []\n", "upstreams.api.window:"),
    ],
)
def test_a_task_file_with_a_huge_integer_duration_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(text.format(n="9" * 400), "t.yaml")
    assert any(field in line and "too large" in line for line in caught.value.problems)


class _Model(BaseModel):
    any_length: Duration = 0.0
    positive: PositiveDuration = 1.0


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"any_length": "0s"}, (0.0, 1.0)),
        ({"any_length": "2m", "positive": "250ms"}, (120.0, 0.25)),
        ({"positive": 3}, (0.0, 3.0)),
    ],
)
def test_field_types_parse(fields: dict[str, object], expected: tuple[float, float]) -> None:
    model = _Model.model_validate(fields)
    assert (model.any_length, model.positive) == expected


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"positive": "0s"}, ("positive",)),
        ({"positive": 0}, ("positive",)),
        ({"any_length": "-1s"}, ("any_length",)),
        ({"any_length": "soon"}, ("any_length",)),
        ({"positive": "0.4ms"}, ("positive",)),
        ({"positive": 0.0004}, ("positive",)),
        ({"any_length": "3651d"}, ("any_length",)),
        ({"positive": 1.0e300}, ("positive",)),
    ],
)
def test_field_types_reject(fields: dict[str, object], location: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        _Model.model_validate(fields)
    assert [error["loc"] for error in caught.value.errors()] == [location]


@given(st.integers(min_value=0, max_value=10**9))
def test_whole_seconds_round_trip(n: int) -> None:
    assert parse_duration(f"{n}s") == n


@given(st.integers(min_value=0, max_value=10**7))
def test_whole_minutes_round_trip(n: int) -> None:
    assert parse_duration(f"{n}m") == n * 60


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=59))
def test_hours_and_minutes_add_up(hours: int, minutes: int) -> None:
    assert parse_duration(f"{hours}h{minutes}m") == hours * 3600 + minutes * 60
