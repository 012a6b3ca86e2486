"""The port: what the executor and scheduler need from a limiter and a breaker store.

Implementations: `memory` (an in-process twin on an injected clock) and `redis_backend`
(shared by every executor and host, on the Redis server's clock). Both follow the pure rules
of `window` and `breaker` exactly; the contract tests run the same cases over both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from taskstream.core.errors import QueueUnavailable
from taskstream.ratelimit.breaker import (
    BreakerConfig,
    BreakerDecision,
    BreakerState,
    Outcome,
    Transition,
)
from taskstream.ratelimit.window import Admission


class GuardUnavailable(QueueUnavailable):
    """Redis could not be reached for a limiter or breaker call; whether it took effect is
    unknown. Callers defer the call as they would on any Redis outage."""


@dataclass(frozen=True, slots=True)
class BreakerUpdate:
    """The breaker after one recorded outcome; `transition` is set when its status changed."""

    state: BreakerState
    transition: Transition | None


class Limiter(Protocol):
    """A sliding-window limiter shared by everyone who uses the same backend."""

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        """Admit one call to upstream `name` and record it when allowed (atomically).

        `limit` calls per `window_ms` plus `burst`, as defined in `window`; raises
        `ConfigError` for values out of range.
        """
        ...


class Breakers(Protocol):
    """Circuit breakers by upstream name, shared by everyone who uses the same backend."""

    async def admit(self, name: str, cfg: BreakerConfig) -> BreakerDecision:
        """Ask whether one call to `name` may go out now (takes a probe slot when half-open)."""
        ...

    async def record(self, name: str, outcome: Outcome, cfg: BreakerConfig) -> BreakerUpdate:
        """Report the outcome of a call that `admit` allowed."""
        ...

    async def state(self, name: str) -> BreakerState:
        """The stored state, unchanged (an open breaker past its cool-down still reads open
        until the next `admit`). A breaker never used reads as a fresh closed one."""
        ...
