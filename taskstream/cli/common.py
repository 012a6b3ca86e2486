"""Shared CLI plumbing: settings from the environment, opening the store and Redis, output."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import IO, Any, TypeVar, cast

import typer
from rich.console import Console

from taskstream.cli.shown import ShownStream
from taskstream.core import notify, streams
from taskstream.core.clock import SystemClock
from taskstream.core.errors import ClusterNotFound
from taskstream.core.protocol import Keys
from taskstream.core.settings import Settings
from taskstream.core.store.sql import SqlStore
from taskstream.runtime.endpoint import Endpoints, resolve

T = TypeVar("T")

# Markup off: what the consoles print holds text from agents, payloads and other writers of
# the streams, where `[bold]` would vanish and `[/x]` would raise instead of being shown. No
# styling, so that every control character in that text can be shown escaped (`shown`).
console = Console(markup=False, color_system=None, file=cast(IO[str], ShownStream("stdout")))
err_console = Console(
    stderr=True, markup=False, color_system=None, file=cast(IO[str], ShownStream("stderr"))
)


def settings() -> Settings:
    """Settings from `TASKSTREAM_*` variables, read once per command."""
    return Settings()


def keys_of(s: Settings) -> Keys:
    return Keys(prefix=s.key_prefix, namespace=s.namespace)


def operator() -> str:
    """Who runs this command, for the history: the login name, or `uid:N` where the user has
    no name (a container run with an arbitrary uid and no passwd entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


LEFTOVER_S = 5.0
"""How long the tasks still running when a command's coroutine returns get to end once
cancelled (s). `asyncio.run` would wait for them without end: an agent that ignores its
cancellation would keep a stopped role from exiting."""


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, except that tasks left running afterwards are cancelled and given
    `LEFTOVER_S` to end; those that do not are abandoned, so the process still exits."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=LEFTOVER_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


@dataclass(slots=True)
class Cluster:
    """Open connections to one cluster's store and (optionally) Redis."""

    settings: Settings
    endpoints: Endpoints
    store: SqlStore
    redis: streams.Redis | None

    @property
    def keys(self) -> Keys:
        return keys_of(self.settings)

    async def hint(self, what: str) -> None:
        """Tell the scheduler something changed (best effort; see `core.notify`)."""
        if self.redis is not None:
            await notify.hint(self.redis, self.keys, what)
        elif self.endpoints.redis_url:
            redis = streams.connect(self.endpoints.redis_url)
            try:
                await notify.hint(redis, self.keys, what)
            finally:
                await redis.aclose()

    @property
    def queue(self) -> streams.Redis:
        """The Redis client; only for clusters opened with `need_redis=True`."""
        if self.redis is None:
            raise ClusterNotFound("this command was opened without Redis")
        return self.redis


@asynccontextmanager
async def open_cluster(
    s: Settings, *, need_redis: bool = True, check: bool = True
) -> AsyncIterator[Cluster]:
    """Resolve the endpoints and open the store (and Redis when needed); close them after.
    With `check` the store must answer now (`StoreUnavailable`); the roles wait instead."""
    endpoints = resolve(s, need_redis=need_redis)
    store = await SqlStore.connect(endpoints.database_url, check=check)
    redis = streams.connect(endpoints.redis_url) if need_redis else None
    try:
        yield Cluster(s, endpoints, store, redis)
    finally:
        await store.close()
        if redis is not None:
            await redis.aclose()


class AgainstNow(typer.BadParameter):
    """A bad argument as read against one `now` only (`--from` after `--to now`): on the
    cluster's clock it may be fine, so `checked_now` reports it only if it holds there too."""


def checked_now(times: Callable[[int], T]) -> tuple[int, T]:
    """The cluster's now (UTC epoch ms) and `times(now)`, the command's times read against
    it. The cluster's now is the database clock, which every role keeps to: an operator's
    host whose clock is off must not give a run a fire time, deadline or business date off
    by as much. `times` runs first on the host's clock, so input bad at any time (malformed,
    fixed ends in the wrong order) is named before any connection is made; an `AgainstNow`
    there is left for the cluster's clock to decide, as this host's may be off."""
    with suppress(AgainstNow):
        times(SystemClock().now_ms())

    async def go() -> int:
        async with open_cluster(settings(), need_redis=False) as cluster:
            return await cluster.store.db_now_ms()

    now_ms = run_async(go())
    return now_ms, times(now_ms)


@asynccontextmanager
async def open_queue(s: Settings) -> AsyncIterator[tuple[streams.Redis, Keys]]:
    """Redis alone, for commands that read only streams (they work while the store is down)."""
    redis = streams.connect(resolve(s, need_redis=True).redis_url)
    try:
        yield redis, keys_of(s)
    finally:
        await redis.aclose()
