"""Real Redis on a clock the test moves: the limiter and breaker scripts as they ship, with
the server's `TIME` replaced by a time passed in with each call.

`VirtualTimeRedis` wraps a client: scripts registered through it read `clock` (passed as two
extra ARGV entries, seconds and microseconds, as `TIME` replies) instead of the server's
clock, and `TIME` itself (alone or in a pipeline) answers from `clock` too. Everything else
goes to the real client, so the keys, the Lua, and the atomicity are Redis's own; several
backends over several wrapped clients share keys as executors on several hosts do.

Keys the scripts give a TTL still expire on the server's clock: tests keep windows long
(seconds at least) so none expires while the test runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

from taskstream.core import streams
from taskstream.core.clock import Clock

SERVER_TIME: Final = "redis.call('TIME')"
PASSED_TIME: Final = "{ARGV[#ARGV - 1], ARGV[#ARGV]}"


def _time(clock: Clock) -> tuple[int, int]:
    now_ms = clock.now_ms()
    return now_ms // 1000, (now_ms % 1000) * 1000


class _Script:
    """A registered script whose `TIME` is the clock's."""

    def __init__(self, redis: streams.Redis, text: str, clock: Clock) -> None:
        if text.count(SERVER_TIME) != 1:
            raise ValueError(f"a script reading TIME {text.count(SERVER_TIME)} times")
        self._script = redis.register_script(text.replace(SERVER_TIME, PASSED_TIME))
        self._clock = clock

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        return await self._script(keys=list(keys), args=[*args, *_time(self._clock)])


class _Pipeline:
    """A pipeline whose `TIME` replies are the clock's."""

    def __init__(self, pipe: Any, clock: Clock) -> None:
        self._pipe, self._clock = pipe, clock
        self._times: list[int] = []

    def time(self) -> _Pipeline:
        self._times.append(len(self._pipe.command_stack))
        self._pipe.time()
        return self

    async def execute(self) -> list[Any]:
        replies = list(await self._pipe.execute())
        for at in self._times:
            replies[at] = _time(self._clock)
        return replies

    async def __aenter__(self) -> _Pipeline:
        await self._pipe.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._pipe.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class VirtualTimeRedis:
    """`redis` with `clock` for the server's clock (see the module doc)."""

    def __init__(self, redis: streams.Redis, clock: Clock) -> None:
        self._redis, self._clock = redis, clock

    def register_script(self, text: str) -> _Script:
        return _Script(self._redis, text, self._clock)

    async def time(self) -> tuple[int, int]:
        return _time(self._clock)

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self._redis.pipeline(transaction=transaction), self._clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)


def virtual(redis: streams.Redis, clock: Clock) -> streams.Redis:
    """`redis` on `clock`, typed as the client the backends take."""
    return cast(streams.Redis, VirtualTimeRedis(redis, clock))
