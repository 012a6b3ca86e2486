"""The CLI run in the test's process against a harness's Redis namespace and store."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner, Result

from taskstream.cli.main import app
from tests.integration.harness import Harness


async def run_cli(h: Harness, db_url: str, redis_url: str, *args: str) -> Result:
    """`taskstream ARGS` on `h`'s namespace and key prefix, the store at `db_url`."""
    env = {
        "TASKSTREAM_DATABASE_URL": db_url,
        "TASKSTREAM_REDIS_URL": redis_url,
        "TASKSTREAM_NAMESPACE": h.keys.namespace,
        "TASKSTREAM_KEY_PREFIX": h.keys.prefix,
        "COLUMNS": "250",
    }
    # The command runs its own event loop: in a thread, beside the test's.
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)
