"""`status` when Redis answers but will not serve it (a database number the server does not
have, a command its ACL refuses, a port where something else answers): the store still
answers, so its counts are shown and Redis is named as what could not be read, exit 1, as
with Redis down. Real Redis (an ACL user of the test's own), real store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness
from tests.integration.outages import TASKS
from tests.support.acl import acl_user, as_user, namespace_rules


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    await harness.trigger(TASKS, "quick")
    return harness


@pytest.fixture
async def not_redis() -> AsyncIterator[str]:
    """A URL whose port answers like a web server, not like Redis."""

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.close()
        await server.wait_closed()


async def _shows_the_store(h: Harness, db_url: str, url: str, error: str) -> None:
    out = await run_cli(h, db_url, url, "status")
    assert out.exit_code == 1, out.output
    assert "instances: PENDING=0  DISPATCHED=1" in out.stdout, out.output
    assert f"redis unavailable: {error}" in out.stdout, out.output
    as_json = await run_cli(h, db_url, url, "status", "--json")
    assert as_json.exit_code == 1, as_json.output
    data = json.loads(as_json.stdout)
    assert data["instances"]["DISPATCHED"] == 1 and "streams" not in data
    assert data["redis_error"].startswith(error)


async def test_status_names_a_database_number_redis_does_not_have(
    h: Harness, db_url: str, redis_url: str
) -> None:
    url = urlunsplit(urlsplit(redis_url)._replace(path="/99999"))
    await _shows_the_store(h, db_url, url, "ResponseError: DB index is out of range")


async def test_status_names_a_command_redis_refuses(
    h: Harness, db_url: str, redis_url: str
) -> None:
    rules = [*namespace_rules(h.keys), "-xinfo"]
    async with acl_user(h.redis, redis_url, rules) as (user, _):
        await _shows_the_store(h, db_url, as_user(redis_url, user), "CommandDenied: ")


async def test_status_names_a_port_that_is_not_redis(
    h: Harness, db_url: str, not_redis: str
) -> None:
    await _shows_the_store(h, db_url, not_redis, "InvalidResponse: ")
