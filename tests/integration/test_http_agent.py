"""The built-in `http` agent end to end: an executor with the upstream gate on real Redis and a
real store runs tasks that call a server on 127.0.0.1. Each call is admitted once and recorded
in its breaker once, whatever the run's outcome."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.agents.registry import default_registry
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.outcome import defer_jitter_max_ms
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps
from taskstream.ratelimit.breaker import BreakerState
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.ratelimit.window import guard_ms
from tests.integration.harness import Harness, Running, until
from tests.support.loopback import Loopback, Reply

MODULES = ("tests.agents", __name__)


class TwiceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str


async def _twice(ctx: AgentContext, params: TwiceParams) -> dict[str, Any]:
    """Calls its upstream twice: the second call needs a slot of its own."""
    statuses = []
    for _ in range(2):
        response = await ctx.http.get(params.url, upstream=ctx.upstreams[0])
        statuses.append(response.status)
    return {"statuses": statuses}


AGENTS = (FunctionAgent(name="twice", params_model=TwiceParams, fn=_twice),)


def tasks(url: str) -> str:
    return f"""
upstreams:
  api: {{limit: 1, window: 60s}}
tasks:
  - id: post
    agent: http
    upstreams: [api]
    retry: {{max_attempts: 3}}
    payload:
      method: POST
      url: "{url}/items?page=1"
      headers: {{Authorization: "Bearer t0ken"}}
      json: {{name: widget}}
  - id: plain
    agent: http
    payload: {{url: "{url}/plain"}}
  - id: twice
    agent: twice
    upstreams: [api]
    retry: {{max_attempts: 1}}
    payload: {{url: "{url}/twice"}}
"""


def gated(h: Harness) -> Executor:
    gate = UpstreamGate(h.store, RedisLimiter(h.redis, h.keys), RedisBreakers(h.redis, h.keys))
    deps = ExecutorDeps(h.store, h.redis, h.keys, default_registry(MODULES), h.clock, gate=gate)
    return Executor(deps, ExecutorConfig(consumer="g1", block_ms=20))


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys, registry_modules=MODULES)
    harness.clock.set(await store.db_now_ms())
    await store.upsert_upstreams({"api": {"limit": 1, "window": 60.0, "burst": None}})
    return harness


async def run_to(h: Harness, server: Loopback, task_id: str, *statuses: Status) -> InstanceRow:
    """Trigger `task_id` against `server` and run an executor until the instance settles."""
    text = tasks(server.url("").rstrip("/"))
    await h.apply(text)
    instance = await h.trigger(text, task_id)
    ex = Running(gated(h))
    try:

        async def settled() -> bool:
            row = await h.store.get_instance(instance.id)
            return row is not None and row.status in statuses

        await until(settled)
    finally:
        await ex.close()
    row = await h.store.get_instance(instance.id)
    assert row is not None
    return row


async def breaker(h: Harness) -> BreakerState:
    return await RedisBreakers(h.redis, h.keys).state("api")


async def slots_used(h: Harness) -> int:
    return int(await h.redis.zcard(h.keys.limiter("api")))


async def test_a_call_that_succeeds_returns_status_and_body(h: Harness) -> None:
    async with Loopback(Reply.json(201, {"id": 7})) as server:
        row = await run_to(h, server, "post", Status.SUCCESS, Status.FAILED, Status.RETRYING)
    assert row.status is Status.SUCCESS, row.last_error
    assert row.result == {"status": 201, "body": {"id": 7}, "truncated": False}
    [seen] = server.seen
    assert (seen.method, seen.target) == ("POST", "/items?page=1")
    assert seen.headers["authorization"] == "Bearer t0ken"
    assert json.loads(seen.body) == {"name": "widget"}
    state = await breaker(h)
    assert (state.window_calls, state.window_failures) == (1, 0)  # recorded once
    assert await slots_used(h) == 1  # the run's admission was the call's


async def test_a_503_retries_and_counts_one_breaker_failure(h: Harness) -> None:
    reply = Reply(503, b"busy", headers={"Retry-After": "120"})
    async with Loopback(reply) as server:
        row = await run_to(h, server, "post", Status.RETRYING, Status.FAILED, Status.SUCCESS)
    assert row.status is Status.RETRYING
    assert row.attempt == 1 and row.result is None
    assert row.last_error is not None and "HTTP 503" in row.last_error
    assert "t0ken" not in row.last_error and "page=1" not in row.last_error
    assert row.next_attempt_at_ms is not None
    assert row.next_attempt_at_ms - h.clock.now_ms() >= 120_000  # Retry-After honoured
    assert [x.reason for x in await h.store.history(row.id)][-1] == "retriable_error"
    assert len(server.seen) == 1
    state = await breaker(h)
    assert (state.window_calls, state.window_failures, state.consecutive_failures) == (1, 1, 1)


async def test_a_404_fails_at_once_and_the_breaker_ignores_it(h: Harness) -> None:
    async with Loopback(Reply(404, b"no such item")) as server:
        row = await run_to(h, server, "post", Status.FAILED, Status.RETRYING, Status.SUCCESS)
    assert row.status is Status.FAILED
    assert row.fail_class is FailClass.FATAL
    assert row.last_error is not None and "HTTP 404" in row.last_error
    assert len(server.seen) == 1
    state = await breaker(h)
    assert (state.window_calls, state.window_failures) == (0, 0)


async def test_a_task_without_upstreams_calls_without_admission(h: Harness) -> None:
    async with Loopback(Reply(200, b"hello", {"Content-Type": "text/plain"})) as server:
        row = await run_to(h, server, "plain", Status.SUCCESS, Status.FAILED, Status.RETRYING)
    assert row.result == {"status": 200, "body": "hello", "truncated": False}
    assert await slots_used(h) == 0
    assert (await breaker(h)).window_calls == 0


async def test_a_call_over_the_limit_mid_run_defers_without_spending_the_attempt(
    h: Harness,
) -> None:
    async with Loopback(Reply(200)) as server:
        row = await run_to(h, server, "twice", Status.RETRYING, Status.FAILED, Status.SUCCESS)
    assert row.status is Status.RETRYING  # max_attempts 1, yet not FAILED
    assert [x.reason for x in await h.store.history(row.id)][-1] == "deferred"
    assert row.next_attempt_at_ms is not None
    longest = 61_000 + guard_ms(60_000) + defer_jitter_max_ms(60_000 + guard_ms(60_000))
    assert 50_000 <= row.next_attempt_at_ms - h.clock.now_ms() <= longest
    assert len(server.seen) == 1
    state = await breaker(h)
    assert (state.window_calls, state.window_failures) == (1, 0)


@pytest.mark.parametrize(
    ("body", "content_type", "text"),
    [
        (b'{"amount": 1e999}', "application/json", '{"amount": 1e999}'),  # parses as inf
        (b'{"name": "\\ud800"}', "application/json", '{"name": "\\ud800"}'),  # lone surrogate
        (b"[" * 5000 + b"]" * 5000, "application/json", "[" * 5000 + "]" * 5000),  # too deep
        (b"+2AA-", "text/plain; charset=utf-7", "?"),  # decodes to a lone surrogate
    ],
    ids=["number-out-of-range", "lone-surrogate", "deep-nesting", "charset-surrogate"],
)
async def test_a_body_the_store_cannot_keep_as_json_succeeds_as_text(
    h: Harness, body: bytes, content_type: str, text: str
) -> None:
    async with Loopback(Reply(201, body, {"Content-Type": content_type})) as server:
        row = await run_to(h, server, "post", Status.SUCCESS, Status.FAILED, Status.RETRYING)
    assert row.status is Status.SUCCESS, row.last_error
    assert row.result == {"status": 201, "body": text, "truncated": False}
    assert len(server.seen) == 1  # the POST was sent once
