"""`taskstream status` shows each upstream's own breaker settings from its stored `breaker:`
(defaults for upstreams without one), driven as a subprocess against a throwaway SQLite store
and the test Redis (its own namespace, whose keys are deleted afterwards)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.ratelimit.breaker import BreakerState, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers
from tests.e2e.cli_rig import Cli, applied

TASKS = """
upstreams:
  llm:
    limit: 4
    window: 60s
    breaker: {failures: 2, failure_rate: 0.25, min_calls: 8, rate_window: 2m,
              cooldown: 5s, probes: 2, probe_timeout: 90s}
  hook: {breaker: {failures: 3, cooldown: 1m}}
  search: {limit: 10, window: 30s}
tasks:
  - {id: summarize, agent: echo, upstreams: [llm, search]}
  - {id: notify, agent: echo, upstreams: [hook]}
"""
LLM = BreakerConfig(
    failure_threshold=2,
    failure_rate=0.25,
    window_ms=120_000,
    min_calls=8,
    cooldown_ms=5_000,
    probes=2,
    probe_timeout_ms=90_000,
)


@pytest.fixture
def cli(tmp_path: Path, redis_url: str) -> Iterator[Cli]:
    with applied(tmp_path, redis_url, {"tasks.yaml": TASKS}) as run:
        yield run


async def _open_llm(cli: Cli) -> BreakerState:
    """`llm`'s breaker opened by its configured 2 failures; one failure on `search`."""
    client = streams.connect(cli.redis_url)
    try:
        breakers = RedisBreakers(client, cli.keys)
        for _ in range(LLM.failure_threshold):
            await breakers.record("llm", Outcome.FAILURE, LLM, probe_round=None)
        await breakers.record("search", Outcome.FAILURE, BreakerConfig(), probe_round=None)
        return await breakers.state("llm")
    finally:
        await client.aclose()


SETTINGS = (
    "failure_threshold",
    "failure_rate",
    "min_calls",
    "rate_window_ms",
    "cooldown_ms",
    "probes",
    "probe_timeout_ms",
)


def _settings(breaker: dict[str, Any]) -> dict[str, Any]:
    return {key: breaker[key] for key in SETTINGS}


def test_status_json_shows_each_upstreams_own_breaker_settings(cli: Cli) -> None:
    opened = asyncio.run(_open_llm(cli))
    assert opened.status == "open"
    data: dict[str, Any] = json.loads(cli("status", "--json"))
    ups = data["upstreams"]
    assert list(ups) == ["hook", "llm", "search"]

    llm = ups["llm"]["breaker"]
    assert _settings(llm) == {
        "failure_threshold": 2,
        "failure_rate": 0.25,
        "min_calls": 8,
        "rate_window_ms": 120_000,
        "cooldown_ms": 5_000,
        "probes": 2,
        "probe_timeout_ms": 90_000,
    }
    assert llm["status"] == "open"
    assert llm["cooldown_ends_ms"] == opened.since_ms + 5_000
    assert llm["cooldown_left_ms"] == llm["cooldown_ends_ms"] - data["upstreams_at_ms"]

    hook = ups["hook"]
    assert hook["limiter"] is None  # a breaker only: no rate limit
    assert (hook["breaker"]["failure_threshold"], hook["breaker"]["cooldown_ms"]) == (3, 60_000)

    search = ups["search"]["breaker"]  # stored without `breaker`: the executors' defaults
    assert _settings(search) == {
        "failure_threshold": 5,
        "failure_rate": 0.5,
        "min_calls": 10,
        "rate_window_ms": 30_000,
        "cooldown_ms": 30_000,
        "probes": 1,
        "probe_timeout_ms": 60_000,
    }
    assert search["consecutive_failures"] == 1


def test_status_prints_each_upstreams_breaker_settings(cli: Cli) -> None:
    asyncio.run(_open_llm(cli))
    out = cli("status")
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}
    assert "2 in a row or 25% of 8+ in 120s; cool-down 5s, 2 probes" in rows["llm"]
    assert "open, cool-down until" in rows["llm"]
    assert "3 in a row or 50% of 10+ in 30s; cool-down 60s, 1 probe" in rows["hook"]
    assert "1/5 in a row, 1 of 1 in window" in rows["search"]
