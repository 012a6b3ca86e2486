"""In-process backends on an injected clock: the twin of `redis_backend` for tests and for a
single-process deployment. Each method runs without awaiting, so it is atomic on one event
loop. State lives in this object only; nothing is shared across processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from taskstream.core.clock import Clock
from taskstream.ratelimit import breaker, window
from taskstream.ratelimit.backend import BreakerStates, BreakerUpdate, Usage, check_window_ms
from taskstream.ratelimit.breaker import BreakerDecision, BreakerState, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.metrics import METRICS, GuardMetrics
from taskstream.ratelimit.window import Admission


class MemoryLimiter:
    """`Limiter` over per-name hits (member -> UTC epoch ms), trimmed to the horizon on each
    call."""

    def __init__(self, clock: Clock, metrics: GuardMetrics = METRICS) -> None:
        self._clock = clock
        self._metrics = metrics
        self._hits: dict[str, dict[str, int]] = {}
        self._made = 0

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        now_ms = self._clock.now_ms()
        oldest_kept = now_ms - window.horizon_ms(window_ms)
        hits = {m: t for m, t in self._hits.get(name, {}).items() if t > oldest_kept}
        answer = window.decide(now_ms, sorted(hits.values()), limit, window_ms, burst)
        if answer.allowed:
            self._made += 1
            member = f"{now_ms}:{self._made}"
            hits[member] = now_ms
            answer = replace(answer, member=member)
        else:
            self._metrics.limiter_refused(name)
        self._hits[name] = hits
        return answer

    async def restamp(self, name: str, member: str, window_ms: int) -> bool:
        check_window_ms(window_ms)
        hits = self._hits.get(name, {})
        at = hits.get(member)
        moved = None if at is None else window.restamped(at, self._clock.now_ms(), window_ms)
        if moved is None:
            hits.pop(member, None)
            return False
        hits[member] = moved
        return True

    async def release(self, name: str, member: str) -> None:
        self._hits.get(name, {}).pop(member, None)

    async def usage(self, name: str, window_ms: int) -> Usage:
        check_window_ms(window_ms)
        now_ms = self._clock.now_ms()
        hits = list(self._hits.get(name, {}).values())
        return Usage(
            used=sum(1 for t in hits if t > now_ms - window_ms),
            in_horizon=sum(1 for t in hits if t > now_ms - window.horizon_ms(window_ms)),
            at_ms=now_ms,
        )


class MemoryBreakers:
    """`Breakers` over a dict of `BreakerState` by name."""

    def __init__(self, clock: Clock, metrics: GuardMetrics = METRICS) -> None:
        self._clock = clock
        self._metrics = metrics
        self._states: dict[str, BreakerState] = {}

    async def admit(self, name: str, cfg: BreakerConfig) -> BreakerDecision:
        decision, self._states[name] = breaker.admit(
            self._states.get(name, BreakerState()), self._clock.now_ms(), cfg
        )
        self._metrics.breaker_seen(name, decision.status, decision.transition)
        return decision

    async def record(
        self, name: str, outcome: Outcome, cfg: BreakerConfig, *, probe_round: int | None
    ) -> BreakerUpdate:
        before = self._states.get(name, BreakerState())
        now_ms = self._clock.now_ms()
        after = breaker.record(before, outcome, now_ms, cfg, probe_round=probe_round)
        self._states[name] = after
        update = BreakerUpdate(after, breaker.transition(before.status, after.status))
        self._metrics.breaker_seen(name, after.status, update.transition)
        return update

    async def state(self, name: str) -> BreakerState:
        return self._seen(name)

    async def states(self, names: Sequence[str]) -> BreakerStates:
        found = {name: self._seen(name) for name in names}
        return BreakerStates(at_ms=self._clock.now_ms(), states=found)

    def _seen(self, name: str) -> BreakerState:
        found = self._states.get(name, BreakerState())
        self._metrics.breaker_seen(name, found.status)
        return found
