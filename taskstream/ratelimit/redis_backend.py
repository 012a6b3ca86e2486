"""Redis backends: limits and breakers shared by every executor and host of one namespace.

Each operation is one Lua script (see `lua`) on the Redis server's clock, so it is atomic and
immune to executor clock skew. Keys come from `Keys.limiter(name)` and `Keys.breaker(name)`.
Driver errors become `GuardUnavailable`. Refusals and breaker states are counted in a
`GuardMetrics` (see `metrics`).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import astuple
from typing import Any

from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core.denials import denied, refused
from taskstream.core.protocol import Keys
from taskstream.ratelimit import breaker, lua
from taskstream.ratelimit.backend import (
    BreakerStates,
    BreakerUpdate,
    GuardUnavailable,
    Usage,
    check_window_ms,
)
from taskstream.ratelimit.breaker import BreakerDecision, BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.metrics import METRICS, GuardMetrics
from taskstream.ratelimit.window import Admission, check_limits


def _token() -> str:
    return secrets.token_hex(8)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def _guarded(what: str, name: str, command: str = "EVALSHA") -> AsyncIterator[None]:
    """Redis failures of a call on `what`'s state for `name`, as taskstream's errors; a denial
    names the command its reply names, else `command` (a key denial names none)."""
    try:
        yield
    except streams.DRIVER_ERRORS as exc:
        raise GuardUnavailable(f"{what} {name}: {exc}") from exc
    except ResponseError as exc:
        if denied(exc):  # waited out like an outage (a `QueueUnavailable`), named as such
            raise refused(exc, command) from exc
        raise


def state_from_reply(values: Sequence[Any]) -> BreakerState:
    """A `BreakerState` from its fields in declaration order (as the scripts reply)."""
    status, *counters = values
    numbers = {name: int(v) for name, v in zip(lua.COUNTER_FIELDS, counters, strict=True)}
    return BreakerState(status=BreakerStatus(_text(status)), **numbers)


def state_from_hash(raw: Mapping[Any, Any]) -> BreakerState:
    """A `BreakerState` from HGETALL, read as the scripts read it: absent fields keep their
    defaults (empty = fresh), a `status` not one of ours makes the whole state fresh, and a
    counter that is not 1 to `lua.COUNTER_DIGITS` ASCII digits is 0 (a hash written by some
    other program fails no read)."""
    values = {_field(k): _field(v) for k, v in raw.items()}
    try:
        status = BreakerStatus(values.get("status", BreakerStatus.CLOSED.value))
    except ValueError:
        return BreakerState()
    counters = {
        name: int(text)
        for name in lua.COUNTER_FIELDS
        if (text := values.get(name)) is not None and _counter(text)
    }
    return BreakerState(status=status, **counters)


def _field(value: bytes | str) -> str:
    """A hash field as text; bytes that are not UTF-8 as U+FFFD (then never a valid value)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _counter(text: str) -> bool:
    """`text` is a counter as the scripts read one: 1 to `lua.COUNTER_DIGITS` ASCII digits."""
    return 0 < len(text) <= lua.COUNTER_DIGITS and text.isascii() and text.isdigit()


def _config_args(cfg: BreakerConfig) -> list[str]:
    return [repr(value) for value in astuple(cfg)]


class RedisLimiter:
    """`Limiter` on one sorted set per upstream, shared cluster-wide.

    `token` makes each hit's member unique; the default is 64 random bits per call.
    """

    def __init__(
        self,
        redis: streams.Redis,
        keys: Keys,
        token: Callable[[], str] = _token,
        metrics: GuardMetrics = METRICS,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._token = token
        self._metrics = metrics
        self._script = redis.register_script(lua.LIMITER)
        self._restamp = redis.register_script(lua.LIMITER_RESTAMP)
        self._usage = redis.register_script(lua.LIMITER_USAGE)

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        check_limits(limit, window_ms, burst)
        async with _guarded("limiter", name):
            allowed, retry_after_ms, in_window, *member = await self._script(
                keys=[self._keys.limiter(name)],
                args=[limit, window_ms, burst, self._token()],
            )
        if not allowed:
            self._metrics.limiter_refused(name)
        hit = _text(member[0]) if member else None
        return Admission(bool(allowed), int(retry_after_ms), int(in_window), hit)

    async def restamp(self, name: str, member: str, window_ms: int) -> bool:
        check_window_ms(window_ms)
        async with _guarded("limiter", name):
            moved = await self._restamp(keys=[self._keys.limiter(name)], args=[window_ms, member])
        return bool(moved)

    async def release(self, name: str, member: str) -> None:
        async with _guarded("limiter", name, "ZREM"):
            await self._redis.zrem(self._keys.limiter(name), member)

    async def usage(self, name: str, window_ms: int) -> Usage:
        check_window_ms(window_ms)
        async with _guarded("limiter", name):
            used, in_horizon, now_ms = await self._usage(
                keys=[self._keys.limiter(name)], args=[window_ms]
            )
        return Usage(used=int(used), in_horizon=int(in_horizon), at_ms=int(now_ms))


class RedisBreakers:
    """`Breakers` on one hash per upstream, shared cluster-wide; half-open probe slots are
    taken atomically, so exactly `cfg.probes` calls are admitted across all executors."""

    def __init__(self, redis: streams.Redis, keys: Keys, metrics: GuardMetrics = METRICS) -> None:
        self._redis = redis
        self._keys = keys
        self._metrics = metrics
        self._admit = redis.register_script(lua.BREAKER_ADMIT)
        self._record = redis.register_script(lua.BREAKER_RECORD)

    async def admit(self, name: str, cfg: BreakerConfig) -> BreakerDecision:
        async with _guarded("breaker", name):
            reply = await self._admit(keys=[self._keys.breaker(name)], args=_config_args(cfg))
        allowed, probe, retry_after_ms, before, *fields = reply
        after = state_from_reply(fields)
        decision = BreakerDecision(
            allowed=bool(allowed),
            probe_round=after.since_ms if probe else None,
            retry_after_ms=int(retry_after_ms),
            status=after.status,
            transition=breaker.transition(BreakerStatus(_text(before)), after.status),
        )
        self._metrics.breaker_seen(name, decision.status, decision.transition)
        return decision

    async def record(
        self, name: str, outcome: Outcome, cfg: BreakerConfig, *, probe_round: int | None
    ) -> BreakerUpdate:
        args = [*_config_args(cfg), outcome.value, "" if probe_round is None else str(probe_round)]
        async with _guarded("breaker", name):
            reply = await self._record(keys=[self._keys.breaker(name)], args=args)
        before, *fields = reply[3:]
        after = state_from_reply(fields)
        update = BreakerUpdate(
            after, breaker.transition(BreakerStatus(_text(before)), after.status)
        )
        self._metrics.breaker_seen(name, after.status, update.transition)
        return update

    async def state(self, name: str) -> BreakerState:
        async with _guarded("breaker", name, "HGETALL"):
            raw = await self._redis.hgetall(self._keys.breaker(name))
        found = state_from_hash(raw)
        self._metrics.breaker_seen(name, found.status)
        return found

    async def states(self, names: Sequence[str]) -> BreakerStates:
        """One MULTI/EXEC of `TIME` and every hash (all keys share the namespace's slot)."""
        async with (
            _guarded("breaker", ", ".join(names), "HGETALL"),
            self._redis.pipeline(transaction=True) as pipe,
        ):
            pipe.time()
            for name in names:
                pipe.hgetall(self._keys.breaker(name))
            (seconds, micros), *hashes = await pipe.execute()
        found = {name: state_from_hash(raw) for name, raw in zip(names, hashes, strict=True)}
        for name, state in found.items():
            self._metrics.breaker_seen(name, state.status)
        return BreakerStates(at_ms=int(seconds) * 1000 + int(micros) // 1000, states=found)
