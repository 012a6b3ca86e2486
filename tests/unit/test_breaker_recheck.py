"""How long a call refused by a breaker waits before asking again: the rest of the cool-down
while open; while half-open, a tenth of the cool-down (at least 1 s) rather than the whole
probe timeout, since a probe usually reports (and closes the breaker) long before that."""

from __future__ import annotations

import pytest

from taskstream.ratelimit.breaker import BreakerStatus, admit, fresh, refused_wait_ms
from taskstream.ratelimit.breaker_config import BreakerConfig

T0 = 1_700_000_000_000
CFG = BreakerConfig(cooldown_ms=30_000, probes=1, probe_timeout_ms=60_000)


def test_open_waits_for_the_rest_of_the_cool_down() -> None:
    decision, _ = admit(fresh(BreakerStatus.OPEN, T0), T0 + 12_000, CFG)
    assert not decision.allowed
    assert refused_wait_ms(decision, CFG) == 18_000


@pytest.mark.parametrize(
    ("cooldown_ms", "elapsed_ms", "wait_ms"),
    [
        (30_000, 0, 3_000),  # a tenth of the cool-down, not the 60 s probe timeout
        (30_000, 58_500, 1_500),  # the probe's slot frees sooner than that
        (5_000, 0, 1_000),  # at least a second
        (600_000, 0, 60_000),  # capped by the probe timeout
    ],
)
def test_half_open_asks_again_well_before_the_probe_timeout(
    cooldown_ms: int, elapsed_ms: int, wait_ms: int
) -> None:
    cfg = BreakerConfig(cooldown_ms=cooldown_ms, probes=1, probe_timeout_ms=60_000)
    probing, state = admit(fresh(BreakerStatus.OPEN, T0), T0 + cooldown_ms, cfg)
    assert probing.allowed and probing.probe
    refused, _ = admit(state, state.since_ms + elapsed_ms, cfg)
    assert not refused.allowed and refused.status is BreakerStatus.HALF_OPEN
    assert refused_wait_ms(refused, cfg) == wait_ms
