"""The pure parts of `taskstream status`'s upstreams section: which upstreams are known, and
how limits, usage and breaker states are shown. No Redis, no store, no clock."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from taskstream.cli.upstreams_view import (
    breaker_view,
    known_upstreams,
    limiter_view,
    render_upstreams,
    stored_upstream,
)
from taskstream.core.definitions import to_records
from taskstream.core.spec_upstreams import UpstreamLimit
from taskstream.core.specfile import parse_task_file_text
from taskstream.ratelimit.backend import Usage
from taskstream.ratelimit.breaker import BreakerStatus, fresh
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.window import Limits

TASKS = """
tasks:
  - {id: summarize, agent: echo, upstreams: [llm, search]}
  - {id: crawl, agent: echo, upstreams: [search]}
  - {id: local, agent: echo}
"""
CFG = BreakerConfig(failure_threshold=5, cooldown_ms=30_000)
NOW_MS = 1_700_000_000_000


def test_known_upstreams_are_stored_ones_and_task_named_ones() -> None:
    records = to_records(parse_task_file_text(TASKS, "tasks.yaml"))
    broken = replace(records[0], task_id="broken", spec={"id": "broken", "upstreams": ["x"]})
    got = known_upstreams({"webhook": {}, "search": {}}, [*records, broken])
    assert got == {"llm": ["summarize"], "search": ["crawl", "summarize"], "webhook": []}


def test_stored_upstreams_load_or_say_why_not() -> None:
    spec = stored_upstream("llm", {"limit": 50, "window": 10.0, "burst": None})
    assert isinstance(spec, UpstreamLimit) and (spec.limit, spec.breaker) == (50, None)
    assert stored_upstream("llm", {"limit": 0, "window": 10.0}) == (
        "limit: Input should be greater than or equal to 1"
    )


def test_used_is_a_percentage_of_the_limit_and_may_pass_100_with_burst() -> None:
    view = limiter_view(Limits(4, 60_000, 2), Usage(used=5, in_horizon=7, at_ms=NOW_MS))
    assert view == {
        "limit": 4,
        "window_ms": 60_000,
        "burst": 2,
        "used": 5,
        "used_pct": 125.0,
        "in_horizon": 7,
    }


def test_an_open_breaker_shows_when_its_cool_down_ends() -> None:
    opened = fresh(BreakerStatus.OPEN, NOW_MS - 10_000)
    view = breaker_view(opened, NOW_MS, CFG)
    assert (view["status"], view["cooldown_ends_ms"]) == ("open", NOW_MS + 20_000)
    assert view["cooldown_left_ms"] == 20_000
    assert breaker_view(opened, NOW_MS + 60_000, CFG)["cooldown_left_ms"] == 0


def test_a_closed_breaker_has_no_cool_down_and_shows_its_failures() -> None:
    state = replace(fresh(BreakerStatus.CLOSED, NOW_MS), consecutive_failures=2, window_calls=3)
    view = breaker_view(state, NOW_MS, CFG)
    assert (view["cooldown_ends_ms"], view["cooldown_left_ms"]) == (None, None)
    assert (view["consecutive_failures"], view["failure_threshold"]) == (2, 5)


def test_the_table_shows_each_state_in_words() -> None:
    half = replace(fresh(BreakerStatus.HALF_OPEN, NOW_MS), probes_admitted=1)
    upstreams = {
        "llm": {
            "tasks": ["summarize"],
            "limiter": limiter_view(Limits(50, 10_000, 5), Usage(12, 12, NOW_MS)),
            "breaker": breaker_view(half, NOW_MS, CFG),
        },
        "search": {
            "tasks": [],
            "limiter": {"error": "limit must be >= 1"},
            "breaker": breaker_view(fresh(BreakerStatus.OPEN, NOW_MS - 8_550), NOW_MS, CFG),
        },
    }
    console = Console(width=250, record=True)
    render_upstreams(console, upstreams)
    text = console.export_text()
    assert "50 / 10s +5 burst" in text
    assert "12 (24%)" in text
    assert "half-open" in text and "probes: 1 out, 0 ok" in text
    assert "invalid: limit must be >= 1" in text
    assert "(in 21.4s)" in text


def test_no_upstreams_is_one_line() -> None:
    console = Console(width=100, record=True)
    render_upstreams(console, {})
    assert console.export_text().strip() == "upstreams: none"
