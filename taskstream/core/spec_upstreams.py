"""The `upstreams:` section of a task file: each upstream's shared rate limit and circuit
breaker. Durations are float seconds (`taskstream.core.durations`); every model is frozen and
forbids unknown fields, as the rest of a task definition (`spec_parts`)."""

from __future__ import annotations

from typing import Final

from pydantic import Field, model_validator

from taskstream.core.durations import PositiveDuration
from taskstream.core.spec_parts import Count, Number, SpecModel

MAX_COUNT: Final = 1_000_000_000
"""The largest call count an upstream's limit, burst and breaker thresholds may name: the
shared limiter keeps its counts as Lua numbers, exact only well below 2**53."""
MAX_PROBES: Final = 1_000
"""The most trial calls a half-open breaker may let through at once."""


class BreakerSpec(SpecModel):
    """An upstream's circuit breaker, shared by every executor (`taskstream.ratelimit.breaker`).

    It opens after `failures` consecutive failures, or when at least `min_calls` calls counted
    in a `rate_window` include a `failure_rate` share (0 < rate <= 1) of failures; stays open
    for `cooldown`; then lets `probes` trial calls through, each presumed lost when it has not
    reported after `probe_timeout`. Durations are float seconds. The defaults are those of
    `BreakerConfig`.
    """

    failures: Count = Field(default=5, ge=1, le=MAX_COUNT)
    failure_rate: Number = Field(default=0.5, gt=0.0, le=1.0, allow_inf_nan=False)
    min_calls: Count = Field(default=10, ge=1, le=MAX_COUNT)
    rate_window: PositiveDuration = 30.0
    cooldown: PositiveDuration = 30.0
    probes: Count = Field(default=1, ge=1, le=MAX_PROBES)
    probe_timeout: PositiveDuration = 60.0


class UpstreamLimit(SpecModel):
    """One upstream of the `upstreams:` section: a shared rate limit of at most `limit` calls
    per sliding `window` seconds, plus `burst`, and its circuit `breaker`.

    `limit` and `window` come together; without them the upstream has no rate limit (`burst`
    then makes no sense and is rejected). `breaker` None means not configured: executors use
    their default `BreakerConfig` (configs stored before `breaker` existed load that way).
    """

    limit: Count | None = Field(default=None, ge=1, le=MAX_COUNT)
    window: PositiveDuration | None = None
    burst: Count | None = Field(default=None, ge=0, le=MAX_COUNT)
    breaker: BreakerSpec | None = None

    @model_validator(mode="after")
    def _limit_with_window(self) -> UpstreamLimit:
        if (self.limit is None) != (self.window is None):
            given, missing = ("limit", "window") if self.window is None else ("window", "limit")
            raise ValueError(
                f"limit and window go together: {given} is set but {missing} is missing "
                "(set both for a rate limit, or neither for a breaker only)"
            )
        if self.burst is not None and self.limit is None:
            raise ValueError("burst needs limit and window (it is headroom above the limit)")
        return self
