"""`taskstream status` lists every upstream (stored limits and names tasks declare) with its
limiter usage and breaker state, driven as a subprocess against a throwaway SQLite store and the
test Redis (its own namespace, whose keys are deleted afterwards)."""

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
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.e2e.cli_rig import Cli, applied

WITH_LIMITS = """
upstreams:
  llm: {limit: 4, window: 60s, burst: 1}
  search: {limit: 10, window: 30s}
tasks:
  - {id: summarize, agent: echo, upstreams: [llm, search]}
  - {id: crawl, agent: echo, upstreams: [search]}
"""
NAMES_ONLY = """
tasks:
  - {id: notify, agent: echo, upstreams: [webhook]}
"""
EXECUTOR_BREAKERS = BreakerConfig()


@pytest.fixture
def cli(tmp_path: Path, redis_url: str) -> Iterator[Cli]:
    with applied(
        tmp_path, redis_url, {"limits.yaml": WITH_LIMITS, "names.yaml": NAMES_ONLY}
    ) as run:
        yield run


async def _load_guards(cli: Cli) -> BreakerState:
    """Three calls on `llm`, `search`'s breaker opened, two failures on `webhook`; returns the
    open breaker's state."""
    client = streams.connect(cli.redis_url)
    try:
        limiter, breakers = RedisLimiter(client, cli.keys), RedisBreakers(client, cli.keys)
        for _ in range(3):
            assert (await limiter.acquire("llm", 4, 60_000, 1)).allowed
        for _ in range(EXECUTOR_BREAKERS.failure_threshold):
            await breakers.record("search", Outcome.FAILURE, EXECUTOR_BREAKERS, probe_round=None)
        for _ in range(2):
            await breakers.record("webhook", Outcome.FAILURE, EXECUTOR_BREAKERS, probe_round=None)
        return await breakers.state("search")
    finally:
        await client.aclose()


async def _llm_used(cli: Cli) -> int:
    client = streams.connect(cli.redis_url)
    try:
        return (await RedisLimiter(client, cli.keys).usage("llm", 60_000)).used
    finally:
        await client.aclose()


def test_status_json_shows_every_upstream(cli: Cli) -> None:
    opened = asyncio.run(_load_guards(cli))
    data: dict[str, Any] = json.loads(cli("status", "--json"))

    assert {"streams", "dead", "instances", "namespace"} <= data.keys()
    ups = data["upstreams"]
    assert list(ups) == ["llm", "search", "webhook"]
    assert [ups[n]["tasks"] for n in ups] == [["summarize"], ["crawl", "summarize"], ["notify"]]

    assert ups["llm"]["limiter"] == {
        "limit": 4,
        "window_ms": 60_000,
        "burst": 1,
        "used": 3,
        "used_pct": 75.0,
        "in_horizon": 3,
    }
    assert ups["llm"]["breaker"]["status"] == "closed"
    assert ups["llm"]["breaker"]["cooldown_ends_ms"] is None

    search = ups["search"]
    assert search["limiter"]["used"] == 0
    assert search["breaker"]["status"] == "open"
    assert search["breaker"]["since_ms"] == opened.since_ms
    ends_ms = opened.since_ms + EXECUTOR_BREAKERS.cooldown_ms
    assert search["breaker"]["cooldown_ends_ms"] == ends_ms
    assert search["breaker"]["cooldown_left_ms"] == ends_ms - data["upstreams_at_ms"]
    assert 0 < search["breaker"]["cooldown_left_ms"] <= EXECUTOR_BREAKERS.cooldown_ms

    webhook = ups["webhook"]
    assert webhook["limiter"] is None
    assert webhook["breaker"]["status"] == "closed"
    assert webhook["breaker"]["consecutive_failures"] == 2
    assert webhook["breaker"]["window_failures"] == 2
    assert webhook["breaker"]["failure_threshold"] == EXECUTOR_BREAKERS.failure_threshold

    assert asyncio.run(_llm_used(cli)) == 3, "status must record no call"


def test_status_prints_an_upstreams_table(cli: Cli) -> None:
    asyncio.run(_load_guards(cli))
    out = cli("status")
    assert "instances:" in out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}
    assert "4 / 60s +1 burst" in rows["llm"]
    assert "3 (75%)" in rows["llm"]
    assert "closed" in rows["llm"]
    assert "open, cool-down until" in rows["search"]
    assert "2/5 in a row, 2 of 2 in window" in rows["webhook"]
