"""Wake-up hints with Redis down: the wait still pauses, so a caller's retry loop cannot spin."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from taskstream.core import notify
from taskstream.core.protocol import Keys
from tests.support.loopback import closed_port


async def test_a_wait_with_redis_down_pauses_instead_of_returning_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The subscription itself fails while Redis is down: that must pause like a failed read,
    or the scheduler's one-second pause after an outage returns at once and it spins."""
    paused: list[float] = []

    async def sleep(seconds: float) -> None:
        paused.append(seconds)

    client = aioredis.Redis(port=closed_port(), retry=Retry(NoBackoff(), 0))
    wakeups = notify.Wakeups(client, Keys("t"))
    monkeypatch.setattr(asyncio, "sleep", sleep)
    try:
        assert await wakeups.wait(5.0) is False
        assert await wakeups.wait(0.25) is False
    finally:
        monkeypatch.undo()
        await wakeups.close()
        await client.aclose()
    assert paused[-2:] == [1.0, 0.25]
