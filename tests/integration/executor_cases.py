"""Shared parts of the executor tests: the task file, a harness with it applied on the
database's clock (each test file's `h` fixture), waits for an instance's status, and an
executor run until instances reach one."""

from __future__ import annotations

from collections.abc import Sequence

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.service import Executor
from tests.integration.harness import Harness, Running, until

TASKS = """
tasks:
  - id: flaky
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s, factor: 2, max: 10s}, jitter: 0}
    payload: {fail_until: 2}
  - id: hopeless
    agent: flaky
    retry: {max_attempts: 3, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 99}
  - id: twice
    agent: flaky
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 99}
  - id: self-cancelled
    agent: flaky
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 1, kind: cancelled}
  - id: fatal
    agent: flaky
    payload: {fail_until: 99, kind: fatal}
  - id: review
    agent: flaky
    payload: {fail_until: 99, kind: review}
  - id: effect
    agent: effect
    retry: {max_attempts: 3}
    payload: {seconds: 0}
  - id: effect-fails-first
    agent: effect
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 1}
  - id: effect-refused-first
    agent: effect
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {fail_until: 1, forget: true}
  - id: slow
    agent: slow
    timeout: 30s
    payload: {seconds: 0.5}
  - id: slow-once
    agent: slow
    retry: {max_attempts: 1}
    payload: {seconds: 0.5}
  - id: too-slow
    agent: slow
    timeout: 0.2s
    retry: {max_attempts: 2, backoff: {base: 1s}, jitter: 0}
    payload: {seconds: 5}
  - id: past-deadline
    agent: slow
    timeout: 30s
    deadline: 0.3s
    retry: {max_attempts: 1}
    payload: {seconds: 5}
  - id: stubborn
    agent: stubborn
    timeout: 0.2s
    lease: 3s
    retry: {max_attempts: 3, retry_on: [retriable]}
    payload: {seconds: 1.5}
  - id: big
    agent: slow
    payload: {seconds: 0, blob: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}
"""


async def harness(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    """The executor tests' harness: `TASKS` applied, the clock set to the database's."""
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())  # rows are stamped by the database clock
    await harness.apply(TASKS)
    return harness


async def status_of(h: Harness, instance_id: str) -> Status:
    row = await h.store.get_instance(instance_id)
    assert row is not None
    return row.status


async def reach(h: Harness, instance_id: str, *wanted: Status) -> None:
    async def check() -> bool:
        return await status_of(h, instance_id) in wanted

    await until(check)


async def run_until(h: Harness, executor: Executor, ids: Sequence[str], *wanted: Status) -> None:
    """Run `executor` until every instance of `ids` is at one of `wanted`, then stop it (also
    when the wait fails)."""
    running = Running(executor)
    try:
        for instance_id in ids:
            await reach(h, instance_id, *wanted)
    finally:
        await running.close()
