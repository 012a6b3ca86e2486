"""Prometheus metrics of upstream protection, updated by the limiter and breaker backends.

Metrics (label `upstream` is the upstream name):

- `taskstream_breaker_transitions_total{upstream, transition}`: breaker status changes this
  process caused; `transition` is `opened`, `half_open` or `closed`. With the Redis backend each
  change happens inside exactly one process's script, so the sum over all processes is the
  cluster's count of changes.
- `taskstream_limiter_refusals_total{upstream}`: calls the sliding-window limiter refused.
- `taskstream_breaker_state{upstream}`: the breaker status this process last saw (any admit,
  record or state read): 0 closed, 1 half-open, 2 open.

The collectors live on `REGISTRY`, this module's own `CollectorRegistry` rather than
prometheus_client's global one: importing the module again (a reload, a test) builds a new
registry instead of registering a name twice. No endpoint serves `REGISTRY` yet: the
per-process one comes with the health endpoints (DESIGN.md §10). Backends take a `GuardMetrics`
and default to `METRICS`; tests can pass their own on a fresh registry and read it with
`CollectorRegistry.get_sample_value`.

Each transition is also a log event, `breaker.opened` (warning), `breaker.half_open` or
`breaker.closed`, with the `upstream`: the operator's record of an outage, with or without a
metrics scraper.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from taskstream.core.logging import get_logger
from taskstream.ratelimit.breaker import BreakerStatus, Transition

STATE_VALUES: Final = {
    BreakerStatus.CLOSED: 0,
    BreakerStatus.HALF_OPEN: 1,
    BreakerStatus.OPEN: 2,
}
"""The value of `taskstream_breaker_state` for each status."""

TRANSITION_EVENTS: Final = {
    Transition.OPENED: "breaker.opened",
    Transition.HALF_OPENED: "breaker.half_open",
    Transition.CLOSED: "breaker.closed",
}
"""The log event of each transition."""


class GuardMetrics:
    """The limiter and breaker metrics on one registry; see the module doc for their meaning."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.transitions = Counter(
            "taskstream_breaker_transitions",
            "Circuit breaker status changes made by this process.",
            ("upstream", "transition"),
            registry=registry,
        )
        self.refusals = Counter(
            "taskstream_limiter_refusals",
            "Calls refused by the shared sliding-window limiter.",
            ("upstream",),
            registry=registry,
        )
        self.state = Gauge(
            "taskstream_breaker_state",
            "Circuit breaker status last seen: 0 closed, 1 half-open, 2 open.",
            ("upstream",),
            registry=registry,
        )

    def limiter_refused(self, upstream: str) -> None:
        """One call to `upstream` was refused by its limiter."""
        self.refusals.labels(upstream=upstream).inc()

    def breaker_seen(
        self, upstream: str, status: BreakerStatus, transition: Transition | None = None
    ) -> None:
        """A backend reply showed `upstream`'s breaker at `status`, after `transition` if any
        (counted, and logged as `breaker.<transition>`)."""
        self.state.labels(upstream=upstream).set(STATE_VALUES[status])
        if transition is not None:
            self.transitions.labels(upstream=upstream, transition=transition.value).inc()
            log = get_logger(upstream=upstream)
            if transition is Transition.OPENED:
                log.warning(TRANSITION_EVENTS[transition])
            else:
                log.info(TRANSITION_EVENTS[transition])


REGISTRY: Final = CollectorRegistry()
"""Every upstream-protection metric of this process."""
METRICS: Final = GuardMetrics(REGISTRY)
"""What the backends update unless given another `GuardMetrics`."""
