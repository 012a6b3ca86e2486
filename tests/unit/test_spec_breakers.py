"""The `breaker:` of an upstream in tasks.yaml, and upstreams without a rate limit: parsing,
defaults, one problem line per bad value, and how they are stored and read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskstream.core.definitions import upstream_configs, upstream_from_config
from taskstream.core.errors import ConfigError
from taskstream.core.spec_upstreams import BreakerSpec, UpstreamLimit
from taskstream.core.specfile import parse_task_file_text

FULL = """
upstreams:
  llm:
    limit: 60
    window: 1m
    breaker: {failures: 3, failure_rate: 0.25, min_calls: 20, rate_window: 2m,
              cooldown: 1m30s, probes: 2, probe_timeout: 45s}
tasks:
  - {id: a, agent: echo, upstreams: [llm]}
"""
BREAKER = """
upstreams:
  llm: {limit: 60, window: 1m, breaker: BREAKER}
tasks: []
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_task_file_text(text, "t.yaml")
    return caught.value.problems


def breaker_problems(breaker: str) -> list[str]:
    return problems_of(BREAKER.replace("BREAKER", breaker))


def test_every_breaker_key_is_read_with_durations_in_seconds() -> None:
    llm = parse_task_file_text(FULL, "t.yaml").upstreams["llm"]
    assert (llm.limit, llm.window) == (60, 60.0)
    assert llm.breaker == BreakerSpec(
        failures=3,
        failure_rate=0.25,
        min_calls=20,
        rate_window=120.0,
        cooldown=90.0,
        probes=2,
        probe_timeout=45.0,
    )


def test_every_breaker_key_is_optional() -> None:
    llm = parse_task_file_text(BREAKER.replace("BREAKER", "{}"), "t.yaml").upstreams["llm"]
    assert llm.breaker == BreakerSpec()
    assert BreakerSpec() == BreakerSpec(
        failures=5,
        failure_rate=0.5,
        min_calls=10,
        rate_window=30.0,
        cooldown=30.0,
        probes=1,
        probe_timeout=60.0,
    )
    partial = parse_task_file_text(BREAKER.replace("BREAKER", "{cooldown: 5s}"), "t.yaml")
    assert partial.upstreams["llm"].breaker == BreakerSpec(cooldown=5.0)


def test_an_upstream_without_breaker_is_not_configured() -> None:
    text = "upstreams: {llm: {limit: 60, window: 1m}}\ntasks: []"
    assert parse_task_file_text(text, "t.yaml").upstreams["llm"].breaker is None


@pytest.mark.parametrize(
    "text",
    [
        "upstreams: {llm: {breaker: {failures: 2}}}\ntasks: []",
        "upstreams: {llm: {}}\ntasks: []",
    ],
)
def test_an_upstream_may_have_no_rate_limit(text: str) -> None:
    llm = parse_task_file_text(text, "t.yaml").upstreams["llm"]
    assert (llm.limit, llm.window, llm.burst) == (None, None, None)


@pytest.mark.parametrize(
    ("breaker", "expected"),
    [
        ("{failures: 0}", "breaker.failures: Input should be greater than or equal to 1"),
        ("{failures: 1.5}", "breaker.failures: Input should be a valid integer, got a number"),
        ("{failure_rate: 0}", "breaker.failure_rate: Input should be greater than 0"),
        ("{failure_rate: 1.5}", "breaker.failure_rate: Input should be less than or equal to 1"),
        ("{failure_rate: 50%}", "breaker.failure_rate: Input should be a valid number"),
        ("{failure_rate: .nan}", "breaker.failure_rate: Input should be a finite number"),
        ("{min_calls: 0}", "breaker.min_calls: Input should be greater than or equal to 1"),
        ("{rate_window: 0s}", "breaker.rate_window: Input should be greater than 0"),
        ("{rate_window: 1x}", "breaker.rate_window: invalid duration '1x': unknown unit 'x'"),
        ("{cooldown: -5}", "breaker.cooldown: invalid duration -5: must not be negative"),
        ("{cooldown: 0}", "breaker.cooldown: Input should be greater than 0"),
        ("{probes: 0}", "breaker.probes: Input should be greater than or equal to 1"),
        ("{probes: 1001}", "breaker.probes: Input should be less than or equal to 1000"),
        ("{failures: true}", "breaker.failures: expected a number, got true"),
        ("{min_calls: false}", "breaker.min_calls: expected a number, got false"),
        ("{failure_rate: true}", "breaker.failure_rate: expected a number, got true"),
        (
            "{failures: 1000000001}",
            "breaker.failures: Input should be less than or equal to 1000000000",
        ),
        ("{probe_timeout: 0ms}", "breaker.probe_timeout: Input should be greater than 0"),
        ("{probe_timeout: 30m1h}", "breaker.probe_timeout: invalid duration '30m1h': units"),
        ("{threshold: 3}", "breaker.threshold: unknown field"),
        ("5", "breaker: Input should be a valid dictionary or instance of BreakerSpec"),
    ],
)
def test_each_bad_breaker_value_is_one_line_naming_the_field(breaker: str, expected: str) -> None:
    [line] = breaker_problems(breaker)
    assert line.startswith(f"t.yaml: upstreams.llm.{expected}"), line


def test_every_bad_breaker_value_is_reported_at_once() -> None:
    lines = breaker_problems("{failures: 0, probes: 0, cooldown: 0}")
    assert [line.split(": ")[1] for line in lines] == [
        "upstreams.llm.breaker.failures",
        "upstreams.llm.breaker.cooldown",
        "upstreams.llm.breaker.probes",
    ]


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        (
            "{limit: 60}",
            "limit and window go together: limit is set but window is missing "
            "(set both for a rate limit, or neither for a breaker only)",
        ),
        (
            "{window: 1m, breaker: {}}",
            "limit and window go together: window is set but limit is missing "
            "(set both for a rate limit, or neither for a breaker only)",
        ),
        ("{burst: 5}", "burst needs limit and window (it is headroom above the limit)"),
    ],
)
def test_limit_and_window_come_together(upstream: str, expected: str) -> None:
    text = f"upstreams: {{llm: {upstream}}}\ntasks: []"
    assert problems_of(text) == [f"t.yaml: upstreams.llm: {expected}"]


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        ("{limit: 0, window: 1m}", "limit: Input should be greater than or equal to 1"),
        ("{limit: true, window: 1m}", "limit: expected a number, got true"),
        (
            "{limit: 1000000001, window: 1m}",
            "limit: Input should be less than or equal to 1000000000",
        ),
        ("{limit: 5, window: 1m, burst: true}", "burst: expected a number, got true"),
        (
            "{limit: 5, window: 1m, burst: 1000000001}",
            "burst: Input should be less than or equal to 1000000000",
        ),
    ],
)
def test_a_limit_field_problem_is_still_named_by_its_field(upstream: str, expected: str) -> None:
    text = f"upstreams: {{llm: {upstream}}}\ntasks: []"
    assert problems_of(text) == [f"t.yaml: upstreams.llm.{expected}"]


# --- storage ----------------------------------------------------------------------------------


def test_the_breaker_is_stored_and_reads_back() -> None:
    stored = upstream_configs(parse_task_file_text(FULL, "t.yaml"))
    assert stored == {
        "llm": {
            "limit": 60,
            "window": 60.0,
            "burst": None,
            "breaker": {
                "failures": 3,
                "failure_rate": 0.25,
                "min_calls": 20,
                "rate_window": 120.0,
                "cooldown": 90.0,
                "probes": 2,
                "probe_timeout": 45.0,
            },
        }
    }
    back = upstream_from_config("llm", stored["llm"])
    assert back == parse_task_file_text(FULL, "t.yaml").upstreams["llm"]


def test_an_upstream_without_breaker_is_stored_as_before() -> None:
    text = "upstreams: {llm: {limit: 60, window: 1m}, hook: {}}\ntasks: []"
    assert upstream_configs(parse_task_file_text(text, "t.yaml")) == {
        "llm": {"limit": 60, "window": 60.0, "burst": None},
        "hook": {"limit": None, "window": None, "burst": None},
    }


def test_a_config_stored_before_breakers_loads_unconfigured() -> None:
    old = upstream_from_config("llm", {"limit": 50, "window": 10.0, "burst": None})
    assert old == UpstreamLimit(limit=50, window=10.0)
    assert old.breaker is None


def test_an_invalid_stored_config_names_the_upstream_and_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        upstream_from_config("llm", {"breaker": {"probes": 0}})
    assert caught.value.problems == [
        "stored upstream 'llm': breaker.probes: Input should be greater than or equal to 1"
    ]


# --- the example in docs/tasks.md ------------------------------------------------------------


def test_the_docs_upstreams_example_is_valid() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text()
    section = doc.split("### `upstreams`", 1)[1].split("\n### ", 1)[0]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    ups = parse_task_file_text(example, "docs/tasks.md").upstreams
    assert ups["openai"].breaker == BreakerSpec(failures=3, cooldown=120.0, probes=2)
    assert (ups["webhook"].limit, ups["webhook"].breaker is not None) == (None, True)
    assert ups["search"].breaker is None
