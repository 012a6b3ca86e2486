"""The executor loop: read only as many entries as there are free slots, handle each in its
own task, and on stop finish what is in flight before returning."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from taskstream.agents.registry import Registry
from taskstream.core import streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.logging import get_logger
from taskstream.core.protocol import Keys
from taskstream.core.store.port import Store
from taskstream.executor.handler import Handler


def consumer_name(start_ms: int) -> str:
    """Unique per process: `host:pid:start`."""
    return f"{socket.gethostname()}:{os.getpid()}:{start_ms}"


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """`concurrency`: runs at once; `block_ms`: longest blocking read; `grace_s`: how long
    in-flight runs may take to finish after stop (seconds)."""

    consumer: str
    concurrency: int = 4
    block_ms: int = 1000
    grace_s: float = 8.0
    max_payload_bytes: int = 256 * 1024


class Executor:
    """One executor process in the `executors` consumer group."""

    def __init__(
        self,
        store: Store,
        redis: streams.Redis,
        keys: Keys,
        registry: Registry,
        config: ExecutorConfig,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._config = config
        self._defs = DefinitionCache(store)
        self._handler = Handler(store, redis, keys, registry, self._defs, config)
        self._running: set[asyncio.Task[None]] = set()
        self._log = get_logger(role="executor", consumer=config.consumer)

    async def run(self, stop: asyncio.Event) -> None:
        """Read and run until `stop` is set, then drain in-flight runs within the grace."""
        await streams.ensure_groups(self._redis, self._keys)
        await self._defs.refresh()
        self._log.info("executor.started", concurrency=self._config.concurrency)
        while not stop.is_set():
            free = self._config.concurrency - len(self._running)
            if free <= 0:
                await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)
                continue
            await self._defs.refresh()
            deliveries = await streams.read(
                self._redis,
                self._keys,
                self._config.consumer,
                count=free,
                block_ms=self._config.block_ms,
            )
            for delivery in deliveries:
                task = asyncio.create_task(self._handler.handle(delivery))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        await self._drain()

    async def _drain(self) -> None:
        if self._running:
            self._log.info("executor.draining", in_flight=len(self._running))
            _, pending = await asyncio.wait(self._running, timeout=self._config.grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._log.info("executor.stopped")
