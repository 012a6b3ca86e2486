"""The thresholds of a circuit breaker (`BreakerConfig`, ms), and how an upstream's `breaker:`
settings in a task file (`BreakerSpec`, seconds) become them. `breaker` says how each is used."""

from __future__ import annotations

from dataclasses import dataclass

from taskstream.core.errors import ConfigError
from taskstream.core.spec_upstreams import BreakerSpec, UpstreamLimit

_POSITIVE_FIELDS = (
    "failure_threshold",
    "window_ms",
    "min_calls",
    "cooldown_ms",
    "probes",
    "probe_timeout_ms",
)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Thresholds of one breaker (see the module doc for how each is used).

    Counts are >= 1, times are ms >= 1, and 0 < `failure_rate` <= 1. `probe_timeout_ms` is how
    long a half-open probe may run without reporting before its slot is handed out again;
    keep it above the longest upstream call so no more than `probes` run at once.
    """

    failure_threshold: int = 5
    failure_rate: float = 0.5
    window_ms: int = 30_000
    min_calls: int = 10
    cooldown_ms: int = 30_000
    probes: int = 1
    probe_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be >= 1, got {getattr(self, name)}"
            for name in _POSITIVE_FIELDS
            if getattr(self, name) < 1
        ]
        if not 0 < self.failure_rate <= 1:
            problems.append(f"failure_rate must be in (0, 1], got {self.failure_rate}")
        if problems:
            raise ConfigError(problems)


def _ms(seconds: float) -> int:
    """Float seconds as whole milliseconds, at least 1 (specs only hold durations > 0)."""
    return max(1, round(seconds * 1000))


def breaker_config(spec: BreakerSpec) -> BreakerConfig:
    """The `breaker:` of an upstream in a task file as a `BreakerConfig` (durations in whole
    ms, >= 1). `BreakerSpec()` converts to `BreakerConfig()`."""
    return BreakerConfig(
        failure_threshold=spec.failures,
        failure_rate=spec.failure_rate,
        window_ms=_ms(spec.rate_window),
        min_calls=spec.min_calls,
        cooldown_ms=_ms(spec.cooldown),
        probes=spec.probes,
        probe_timeout_ms=_ms(spec.probe_timeout),
    )


def upstream_breaker_config(
    upstream: UpstreamLimit | None, default: BreakerConfig
) -> BreakerConfig:
    """The breaker settings of one upstream: its own `breaker:` when it has one, else
    `default` (an upstream with no stored config, or one stored without `breaker`)."""
    if upstream is None or upstream.breaker is None:
        return default
    return breaker_config(upstream.breaker)
