"""Admission of a claimed run to its upstreams (DESIGN.md §8): after the claim and before the
agent runs, every upstream the task names must have a closed (or probing) breaker and a free
slot in its shared sliding window. A refused run is deferred (RETRYING at the time the slot or
the breaker frees) without spending an attempt. After the run, its outcome is recorded in the
breakers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from taskstream.core.logging import get_logger
from taskstream.core.spec_parts import UpstreamLimit
from taskstream.core.store.port import Store
from taskstream.ratelimit.backend import Breakers, Limiter
from taskstream.ratelimit.breaker import BreakerConfig, Outcome
from taskstream.ratelimit.window import Limits, limits_from_spec

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
        self._limits = {
            name: limits_from_spec(UpstreamLimit.model_validate(cfg))
            for name, cfg in stored.items()
        }
        self._loaded_at = time.monotonic()

    async def admit(self, upstreams: Sequence[str]) -> int | None:
        """None when the run may call every upstream now; else the wait (ms) before retrying."""
        await self._reload()
        for name in upstreams:
            decision = await self._breakers.admit(name, self._config)
            if not decision.allowed:
                self._log.info(
                    "upstream.breaker_refused",
                    upstream=name,
                    retry_after_ms=decision.retry_after_ms,
                )
                return max(1, decision.retry_after_ms)
            limits = self._limits.get(name)
            if limits is None:
                continue
            admission = await self._limiter.acquire(name, *limits)
            if not admission.allowed:
                self._log.info(
                    "upstream.limited", upstream=name, retry_after_ms=admission.retry_after_ms
                )
                return max(1, admission.retry_after_ms)
        return None

    async def record(self, upstreams: Sequence[str], outcome: Outcome) -> None:
        """Feed a run's outcome to the breakers of its upstreams; log state changes."""
        for name in upstreams:
            update = await self._breakers.record(name, outcome, self._config)
            if update.transition is not None:
                self._log.warning("upstream.breaker", upstream=name, transition=update.transition)
