"""The liveness key of an executor process, also kept from a thread of its own.

The heartbeat's liveness loop runs on the event loop with every run. An agent that holds the
loop (CPU-bound work, a blocking call) stops that loop too: past the liveness TTL the key
expires, and a sweeper takes the live process for gone and times out every run it holds as
its owner's, healthy ones included, though their leases still run (their commits are then
fenced). This thread sets the key again every third of the TTL whatever the loop does, with a
client of its own on a loop of its own (a client belongs to the loop that made it).

Leases are still extended by the event loop alone: a loop held longer than a lease loses that
lease, and a process wedged for good keeps its key while its runs are taken over once their
leases expire, as for a process whose store does not answer (`heartbeat`). Outages and
denials are logged by the heartbeat's own refresh, not here.
"""

from __future__ import annotations

import asyncio
import threading

import redis.asyncio as aioredis

from taskstream.core import streams
from taskstream.core.errors import CommandDenied
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys

JOIN_S = 2.0
"""Longest wait for the thread to end at stop (s): a refresh waiting on a frozen Redis is
left behind (the thread is a daemon), as the loop's own clear of the key would be."""


class LivenessThread:
    """Sets `keys.alive(consumer)` for `ttl_ms` every third of it (at least 0.2 s), from
    `start` until `stop`."""

    def __init__(self, redis: streams.Redis, keys: Keys, consumer: str, ttl_ms: int) -> None:
        pool = redis.connection_pool
        self._connection_class, self._kwargs = pool.connection_class, dict(pool.connection_kwargs)
        self._keys, self._consumer, self._ttl_ms = keys, consumer, ttl_ms
        self._interval_s = max(0.2, ttl_ms / 3000)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"liveness {consumer}", daemon=True)
        self._log = get_logger(role="executor", consumer=consumer)

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """End the thread (waiting `JOIN_S` at most, off the event loop); before the key is
        removed, so that no refresh sets it again."""
        self._stopped.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, JOIN_S)

    def _main(self) -> None:
        with asyncio.Runner() as runner:
            pool = aioredis.ConnectionPool(connection_class=self._connection_class, **self._kwargs)
            client = aioredis.Redis(connection_pool=pool)
            try:
                while True:
                    runner.run(self._refresh(client))
                    if self._stopped.wait(self._interval_s):
                        return
            finally:
                runner.run(client.aclose(close_connection_pool=True))

    async def _refresh(self, client: streams.Redis) -> None:
        try:
            refresh = streams.mark_alive(client, self._keys, self._consumer, self._ttl_ms)
            await asyncio.wait_for(refresh, timeout=self._interval_s)
        except (TimeoutError, CommandDenied, *streams.DRIVER_ERRORS):
            pass  # logged by the heartbeat's refresh, which meets the same outage
        except Exception as exc:  # the thread must outlive any one refresh
            self._log.error(
                "heartbeat.failed",
                part="liveness_thread",
                error_type=type(exc).__name__,
                error=str(exc)[:300],
            )
