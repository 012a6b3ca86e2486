"""Admission of a claimed run to its upstreams (DESIGN.md §8): after the claim and before the
agent runs, every upstream the task names must have a closed (or probing) breaker and a free
slot in its shared sliding window. A refused run is deferred (RETRYING at the time the slot or
the breaker frees) without spending an attempt.

During the run the gate is bound as the agent's `UpstreamAccess` (`RunUpstreams`): calls
through the context's HTTP client are admitted and recorded one by one, the first call to a
declared upstream using the run's admission. After the run, its outcome is recorded in the
breakers of the admissions no call reported on."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from taskstream.core.logging import get_logger
from taskstream.core.spec_parts import UpstreamLimit
from taskstream.core.store.port import Store
from taskstream.ratelimit.backend import Breakers, Limiter
from taskstream.ratelimit.breaker import BreakerConfig, Outcome
from taskstream.ratelimit.window import Limits, guarded, limits_from_spec

RELOAD_S = 10.0
"""How often stored upstream limits are read again (seconds)."""


class UpstreamGate:
    """Limiter and breaker checks for one executor process."""

    def __init__(
        self,
        store: Store,
        limiter: Limiter,
        breakers: Breakers,
        config: BreakerConfig | None = None,
    ) -> None:
        self._store, self._limiter, self._breakers = store, limiter, breakers
        self._config = config or BreakerConfig()
        self._limits: dict[str, Limits] = {}
        self._loaded_at = float("-inf")
        self._log = get_logger(role="executor")

    async def _reload(self) -> None:
        if time.monotonic() - self._loaded_at < RELOAD_S:
            return
        stored = await self._store.list_upstreams()
        # Guarded: arrivals at the upstream, not only admissions, respect the limit.
        self._limits = {
            name: guarded(limits_from_spec(UpstreamLimit.model_validate(cfg)))
            for name, cfg in stored.items()
        }
        self._loaded_at = time.monotonic()

    async def admit(self, upstreams: Sequence[str]) -> int | None:
        """None when the run may call every upstream now; else the wait (ms) before retrying."""
        for name in upstreams:
            wait_ms = await self.admit_one(name)
            if wait_ms is not None:
                return wait_ms
        return None

    async def admit_one(self, name: str) -> int | None:
        """Admit one call to `name`: None when it may go now (a breaker probe or a window slot
        is taken), else the wait (ms, >= 1) before asking again."""
        await self._reload()
        decision = await self._breakers.admit(name, self._config)
        if not decision.allowed:
            self._log.info(
                "upstream.breaker_refused", upstream=name, retry_after_ms=decision.retry_after_ms
            )
            return max(1, decision.retry_after_ms)
        limits = self._limits.get(name)
        if limits is None:
            return None
        admission = await self._limiter.acquire(name, *limits)
        if not admission.allowed:
            self._log.info(
                "upstream.limited", upstream=name, retry_after_ms=admission.retry_after_ms
            )
            if decision.probe:  # hand the half-open probe slot back: no call goes out
                await self._breakers.record(name, Outcome.IGNORE, self._config)
            return max(1, admission.retry_after_ms)
        return None

    async def record(self, upstreams: Sequence[str], outcome: Outcome) -> None:
        """Feed a run's outcome to the breakers of its upstreams; log state changes."""
        for name in upstreams:
            update = await self._breakers.record(name, outcome, self._config)
            if update.transition is not None:
                self._log.warning("upstream.breaker", upstream=name, transition=update.transition)

    def bind(self, admitted: Sequence[str]) -> RunUpstreams:
        """The gate as one run's `UpstreamAccess`; `admitted` are the upstreams `admit` has
        already let this run call once."""
        return RunUpstreams(self, admitted)


class RunUpstreams:
    """One run's `UpstreamAccess` (what its `UpstreamClient` asks), over the process's gate.

    The run was admitted once per declared upstream before its agent started; the client's
    first call to each of those uses that admission, later calls are admitted anew. After the
    run, `settle` records the run's outcome for exactly the admissions no call reported on:
    declared upstreams the client never called, and calls cut short by cancellation. So each
    admitted call is recorded in its breaker once.
    """

    def __init__(self, gate: UpstreamGate, admitted: Sequence[str]) -> None:
        self._gate = gate
        self._spare = set(admitted)
        self._called: set[str] = set()
        self._open: Counter[str] = Counter()

    async def acquire(self, name: str) -> int | None:
        """Admit one call to `name` (the run's spare admission first); None or a wait (ms)."""
        self._called.add(name)
        if name in self._spare:
            self._spare.discard(name)
            wait_ms = None
        else:
            wait_ms = await self._gate.admit_one(name)
        if wait_ms is None:
            self._open[name] += 1
        return wait_ms

    async def record(self, name: str, outcome: Outcome) -> None:
        """Record one admitted call's outcome in `name`'s breaker."""
        self._open[name] = max(0, self._open[name] - 1)
        await self._gate.record((name,), outcome)

    async def settle(self, declared: Sequence[str], outcome: Outcome) -> None:
        """After the run: record `outcome` for the admissions that no call has reported on."""
        unused = [name for name in declared if name not in self._called]
        unreported = [name for name, count in self._open.items() for _ in range(count)]
        self._open.clear()
        await self._gate.record([*unused, *unreported], outcome)
