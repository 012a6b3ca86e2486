"""`taskstream tasks apply` stores the file's `upstreams:` limits next to the tasks."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from taskstream.core.store.sql import SqlStore
from tests.e2e.cli_rig import migrated_store, run_cli

TASKS = """
upstreams:
  llm: {limit: 50, window: 10s}
tasks:
  - {id: summarize, agent: echo, upstreams: [llm]}
"""


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, check=True)


def test_apply_stores_upstream_limits(tmp_path: Path) -> None:
    url = migrated_store(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_DATABASE_URL"] = url
    (tmp_path / "tasks.yaml").write_text(TASKS)
    out = cli(env, "tasks", "apply", str(tmp_path / "tasks.yaml")).stdout
    assert "summarize: created" in out
    assert "upstream llm: created" in out

    async def stored() -> dict[str, dict[str, object]]:
        store = await SqlStore.connect(url)
        try:
            return await store.list_upstreams()
        finally:
            await store.close()

    assert asyncio.run(stored()) == {"llm": {"limit": 50, "window": 10.0, "burst": None}}
