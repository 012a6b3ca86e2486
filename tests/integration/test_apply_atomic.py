"""`taskstream tasks apply` writes a file's tasks and upstream limits in one transaction: a
store that fails on the upstreams' write, after the tasks' statements ran, leaves neither
stored, so no task is left naming limits that were never written."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.cli_in_process import run_cli
from tests.integration.executor_cases import harness
from tests.integration.harness import Harness
from tests.support.refused_inserts import MESSAGE, refused_inserts

TASKS = """
upstreams:
  llm: {limit: 50, window: 10s}
tasks:
  - {id: summarize, agent: echo, upstreams: [llm]}
"""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def test_a_store_failing_on_the_upstreams_leaves_no_task_applied(
    h: Harness, db_url: str, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(TASKS)
    async with refused_inserts(h.store.engine, "upstreams"):
        failed = await run_cli(h, db_url, redis_url, "tasks", "apply", str(path))
    assert failed.exit_code != 0, failed.output
    assert MESSAGE in str(failed.exception), failed.output
    assert "summarize" not in await _task_ids(h), "no task without its upstreams"
    assert await h.store.list_upstreams() == {}
    applied = await run_cli(h, db_url, redis_url, "tasks", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    assert "summarize: created" in applied.stdout
    assert "upstream llm: created" in applied.stdout
    assert "summarize" in await _task_ids(h)
    assert set(await h.store.list_upstreams()) == {"llm"}


async def _task_ids(h: Harness) -> set[str]:
    return {d.task_id for d in await h.store.list_definitions()}
