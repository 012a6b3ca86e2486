"""Rigs: one backend pair (limiter + breakers) and a way to let its clock pass.

The memory rig runs on a `FixedClock` that tests move exactly. The Redis rig runs on the Redis
server's clock, which cannot be moved: `wait_until_ms` polls `TIME` until the moment has come
(bounded by a deadline), so no test depends on a sleep being long enough.

Each rig counts into its own `GuardMetrics` on a fresh registry (`rig.metrics`), so a test
reads only the refusals and transitions it caused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, Protocol

from prometheus_client import CollectorRegistry

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.ratelimit.backend import Breakers, Limiter
from taskstream.ratelimit.memory import MemoryBreakers, MemoryLimiter
from taskstream.ratelimit.metrics import GuardMetrics
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from tests.support.keyspace import drop_keys

KINDS: Final = ("memory", "redis")
START_MS: Final = 1_700_000_000_000
WAIT_DEADLINE_S: Final = 5.0


class Rig(Protocol):
    kind: str
    limiter: Limiter
    breakers: Breakers
    metrics: GuardMetrics

    async def now_ms(self) -> int:
        """The backend's clock, UTC epoch ms."""
        ...

    async def wait_until_ms(self, at_ms: int) -> None:
        """Return once the backend's clock reads at least `at_ms`."""
        ...


class MemoryRig:
    kind = "memory"

    def __init__(self, start_ms: int = START_MS) -> None:
        self.clock = FixedClock(start_ms)
        self.metrics = GuardMetrics(CollectorRegistry())
        self.limiter: Limiter = MemoryLimiter(self.clock, self.metrics)
        self.breakers: Breakers = MemoryBreakers(self.clock, self.metrics)

    async def now_ms(self) -> int:
        return self.clock.now_ms()

    async def wait_until_ms(self, at_ms: int) -> None:
        self.clock.set(max(at_ms, self.clock.now_ms()))


class RedisRig:
    kind = "redis"

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.metrics = GuardMetrics(CollectorRegistry())
        self.limiter: Limiter = RedisLimiter(redis, keys, metrics=self.metrics)
        self.breakers: Breakers = RedisBreakers(redis, keys, self.metrics)

    async def now_ms(self) -> int:
        seconds, micros = await self.redis.time()
        return seconds * 1000 + micros // 1000

    async def wait_until_ms(self, at_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_DEADLINE_S
        while (now := await self.now_ms()) < at_ms:
            if loop.time() > deadline:
                raise TimeoutError(f"Redis clock still at {now} ms, waiting for {at_ms} ms")
            await asyncio.sleep(min(at_ms - now, 50) / 1000)


@asynccontextmanager
async def open_rig(kind: str, redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    """A rig of `kind`; the Redis one uses keys of `namespace` only and deletes them after."""
    if kind == "memory":
        yield MemoryRig()
        return
    keys = Keys(prefix="tstest", namespace=namespace)
    client = streams.connect(redis_url)
    try:
        yield RedisRig(client, keys)
    finally:
        await drop_keys(client, keys)
        await client.aclose()
