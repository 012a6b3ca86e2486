"""An agent that, cancelled, lets out another exception (a cleanup that fails, a wrapper that
converts every error): cancelled at its attempt's time limit, the attempt is still a timeout
under the task's `retry_on`; cancelled by a stop, the run is still released, not counted.

The module is its own agent module (`AGENTS`), so executors built by the harness load it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.agents.base import AgentContext, FunctionAgent
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.reasons import RELEASED
from taskstream.core.states import FailClass, Status
from taskstream.core.store.sql import SqlStore
from tests.agents import Params
from tests.integration.executor_cases import harness, run_until
from tests.integration.harness import Harness, Running, until

STARTED: set[str] = set()
"""Instance ids whose agent has begun its wait."""


async def _converts(ctx: AgentContext, p: Params) -> dict[str, Any]:
    STARTED.add(ctx.instance_id)
    try:
        await asyncio.sleep(p.seconds)
    except asyncio.CancelledError:
        raise RuntimeError("cleanup after cancellation failed") from None
    return {}


AGENTS = (FunctionAgent(name="converts", params_model=Params, fn=_converts),)

TASKS = """
tasks:
  - id: timed
    agent: converts
    timeout: 0.2s
    retry: {max_attempts: 3, retry_on: [retriable], backoff: {base: 1s}, jitter: 0}
    payload: {seconds: 30}
  - id: once
    agent: converts
    timeout: 60s
    retry: {max_attempts: 1}
    payload: {seconds: 30}
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    STARTED.clear()  # instance ids repeat across the database kinds
    made = await harness(store, redis, keys)
    made.registry_modules = ("tests.agents", __name__)
    await made.apply(TASKS)
    return made


async def test_an_agent_raising_on_its_way_out_of_the_time_limit_timed_out(h: Harness) -> None:
    """`retry_on` has no `timeout`: a run past its time limit fails `fatal` at once, rather
    than being retried as the agent's RuntimeError would be."""
    row = await h.trigger(TASKS, "timed")
    await run_until(h, h.executor(), [row.id], Status.FAILED, Status.RETRYING)
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.status, done.fail_class) == (Status.FAILED, FailClass.FATAL)
    assert done.last_error is not None and done.last_error.startswith("TimeoutError")


async def test_a_run_a_stop_cut_short_is_released_whatever_its_agent_raised(
    h: Harness,
) -> None:
    """The stop cancels the run after its grace and the agent lets out a RuntimeError: the
    run was cut short by the shutdown, so it is handed back, not failed on its one attempt."""
    row = await h.trigger(TASKS, "once")
    ex = Running(h.executor(grace_s=0.1))
    try:
        await until(lambda: _true(row.id in STARTED))
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None
    last = (await h.store.history(row.id))[-1]
    assert (done.status, last.reason) == (Status.RETRYING, RELEASED), (done, last)


async def _true(value: bool) -> bool:
    return value
