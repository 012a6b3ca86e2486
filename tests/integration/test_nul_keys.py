"""A dedupe key holding a NUL, on PostgreSQL (whose text refuses one): refused with the
field named when the task file is applied or the run triggered, before anything is stored,
rather than by the store when an instance is made."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taskstream.core import streams
from taskstream.core.errors import ConfigError, UsageError
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness
from tests.support.databases import available_kinds, temp_database

REGIONAL = """
tasks:
  - id: regional
    agent: echo
    dedupe_key: "{task_id}:{payload.region}"
    payload: {region: eu}
"""


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    if "postgres" not in available_kinds():
        pytest.skip("PostgreSQL is not reachable")
    async with temp_database("postgres") as url:
        yield url


@pytest.fixture
async def h(pg_url: str, redis: streams.Redis, keys: Keys) -> AsyncIterator[Harness]:
    store = await SqlStore.connect(pg_url)
    try:
        yield Harness(store, redis, keys)
    finally:
        await store.close()


async def test_a_task_file_whose_key_holds_a_nul_is_refused(
    h: Harness, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(REGIONAL.replace("{payload.region}", "{payload.region}\\0"))
    done = await run_cli(h, pg_url, redis_url, "tasks", "apply", str(path))
    assert isinstance(done.exception, ConfigError), done.output  # exit 2
    [problem] = done.exception.problems
    assert problem.startswith(f"{path}: task 'regional': dedupe_key:")
    assert "NUL character" in problem
    assert await h.store.list_definitions() == []


async def test_a_trigger_whose_key_renders_a_nul_is_refused_up_front(
    h: Harness, pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(REGIONAL)
    applied = await run_cli(h, pg_url, redis_url, "tasks", "apply", str(path))
    assert applied.exit_code == 0, applied.output
    payload = '{"region": "a\\u0000b"}'
    done = await run_cli(h, pg_url, redis_url, "trigger", "regional", "--payload", payload)
    assert isinstance(done.exception, UsageError), done.output  # exit 2
    assert "task 'regional': dedupe_key: renders with a NUL character" in str(done.exception)
    assert await h.store.list_instances(task_id="regional") == []
    ok = await run_cli(h, pg_url, redis_url, "trigger", "regional")
    assert ok.exit_code == 0, ok.output
    assert len(await h.store.list_instances(task_id="regional")) == 1
