"""The port: what the executor and scheduler need from a limiter and a breaker store.

Implementations: `memory` (an in-process twin on an injected clock) and `redis_backend`
(shared by every executor and host, on the Redis server's clock). Both follow the pure rules
of `window` and `breaker` exactly; the contract tests run the same cases over both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from taskstream.core.errors import ConfigError, QueueUnavailable
from taskstream.ratelimit.breaker import BreakerDecision, BreakerState, Outcome, Transition
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.window import Admission


class GuardUnavailable(QueueUnavailable):
    """Redis could not be reached for a limiter or breaker call; whether it took effect is
    unknown. Callers defer the call as they would on any Redis outage."""


@dataclass(frozen=True, slots=True)
class BreakerUpdate:
    """The breaker after one recorded outcome; `transition` is set when its status changed."""

    state: BreakerState
    transition: Transition | None


@dataclass(frozen=True, slots=True)
class Usage:
    """How much of one limiter is in use at `at_ms` (the backend's clock, UTC epoch ms).

    `used`: hits in the window `(at_ms - window_ms, at_ms]`, the count that `limit + burst`
    caps. `in_horizon`: hits in `(at_ms - 2 * window_ms, at_ms]`, the count that `2 * limit`
    caps (see `window`). Reading usage records nothing.
    """

    used: int
    in_horizon: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class BreakerStates:
    """Stored breaker states read together at `at_ms` (the backend's clock, UTC epoch ms)."""

    at_ms: int
    states: Mapping[str, BreakerState]


def check_window_ms(window_ms: int) -> int:
    """`window_ms` when it is >= 1; else `ConfigError`."""
    if window_ms < 1:
        raise ConfigError([f"window_ms must be >= 1, got {window_ms}"])
    return window_ms


class Limiter(Protocol):
    """A sliding-window limiter shared by everyone who uses the same backend."""

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        """Admit one call to upstream `name` and record it when allowed (atomically).

        `limit` calls per `window_ms` plus `burst`, as defined in `window`; raises
        `ConfigError` for values out of range.
        """
        ...

    async def restamp(self, name: str, member: str, window_ms: int) -> bool:
        """The call of hit `member` (from its `Admission`) is being sent now: move the hit to
        now when it is still in the `window_ms` window ending now, and say True; else say
        False, and the call must not be sent: a stale hit (older) is forgotten then, so a call
        never sent holds no slot, not even of the long cap (see `window`)."""
        ...

    async def release(self, name: str, member: str) -> None:
        """Forget hit `member` (from its `Admission`): its call will not be sent (the run was
        refused by another of its upstreams), so it must not hold a slot of the window."""
        ...

    async def usage(self, name: str, window_ms: int) -> Usage:
        """Count upstream `name`'s hits in the window ending now, recording nothing.

        Hits older than the horizon of the windows `acquire` was called with may already be
        gone, so ask with the same `window_ms`. Raises `ConfigError` when `window_ms` < 1.
        """
        ...


class Breakers(Protocol):
    """Circuit breakers by upstream name, shared by everyone who uses the same backend."""

    async def admit(self, name: str, cfg: BreakerConfig) -> BreakerDecision:
        """Ask whether one call to `name` may go out now (takes a probe slot when half-open)."""
        ...

    async def record(
        self, name: str, outcome: Outcome, cfg: BreakerConfig, *, probe_round: int | None
    ) -> BreakerUpdate:
        """Report the outcome of a call that `admit` allowed; `probe_round` is its decision's
        `probe_round` (see `breaker.record`: while half-open, only the current round's probes
        count)."""
        ...

    async def state(self, name: str) -> BreakerState:
        """The stored state, unchanged (an open breaker past its cool-down still reads open
        until the next `admit`). A breaker never used reads as a fresh closed one."""
        ...

    async def states(self, names: Sequence[str]) -> BreakerStates:
        """`state` of every name, read at one moment of the backend's clock (for reports)."""
        ...
