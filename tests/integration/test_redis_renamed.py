"""A server that does not know a command the roles need (`rename-command` renamed XADD):
the start-up check names it, and a sweeper meeting it at a dead letter logs `redis.denied`,
leaves the entry pending (neither acked nor lost) and keeps sweeping.

The module runs its own Valkey server, started with the renaming (a server's config only)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from random import Random
from typing import Any

import pytest
from structlog.testing import capture_logs

from taskstream.core import redis_needs, streams
from taskstream.core import streams_admin as admin
from taskstream.core.protocol import GROUP, Priority
from taskstream.executor.sweeper import Sweeper, SweeperConfig
from taskstream.runtime.embedded import EmbeddedValkey
from tests.integration.harness import Harness, until

RENAMED = "XADD_RENAMED_FOR_TEST"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey server of this module's own, whose XADD is known by another name only."""
    with EmbeddedValkey(
        tmp_path_factory.mktemp("valkey"), [f"rename-command XADD {RENAMED}"]
    ) as url:
        yield url


async def test_the_start_check_names_the_unknown_command(outage: Harness) -> None:
    for calls in (redis_needs.executor_calls, redis_needs.sweeper_calls):
        refused = await redis_needs.refusals(outage.redis, calls(outage.keys))
        assert [r.command for r in refused] == ["XADD"]
        assert "unknown command" in refused[0].reply and "with args" not in refused[0].reply
    assert await outage.redis.ping()  # the checked connection is back, out of its transaction


async def test_a_dead_letter_the_server_cannot_make_leaves_the_entry(outage: Harness) -> None:
    h = outage
    stream = h.keys.stream(Priority.DEFAULT)
    raw: Any = h.redis
    junk = streams.as_text(await raw.execute_command(RENAMED, stream, "*", "v", "99"))
    await h.redis.xreadgroup(GROUP, "gone", {stream: ">"}, count=1)
    config = SweeperConfig(interval_s=0.05, min_idle_ms=0)
    sweeper = Sweeper(h.store, h.redis, h.keys, h.clock, config, Random(7))
    stop = asyncio.Event()
    with capture_logs() as logs:
        sweeping = asyncio.create_task(sweeper.run(stop))
        try:

            async def told() -> bool:
                return any(e["event"] == "redis.denied" for e in logs) or sweeping.done()

            await until(told)
            h.clock.advance(120_000)  # the entry is tried again after its pause

            async def twice() -> bool:
                return len([e for e in logs if e["event"] == "redis.denied"]) > 1

            await until(twice)
            assert not sweeping.done(), sweeping.exception()
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(sweeping, return_exceptions=True), 20)
    pending = await admin.pending(h.redis, stream, count=10)
    assert [p.entry_id for p in pending] == [junk]  # neither acked nor lost
    assert await h.redis.xlen(h.keys.dead) == 0
    denied = next(e for e in logs if e["event"] == "redis.denied")
    assert denied["command"] == "XADD" and denied["entry_id"] == junk
    assert "unknown command" in denied["reply"]
