"""Each upstream's own breaker settings: the pure conversion of a `breaker:` spec (seconds) to a
`BreakerConfig` (ms), the fallback for upstreams without one, the interval cache of stored
configs, and the scheduler's holds using each upstream's cool-down. In-memory breakers on an
injected clock; no Redis, no store, no sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.core.clock import FixedClock
from taskstream.core.definitions import UpstreamCache
from taskstream.core.errors import StoreUnavailable
from taskstream.core.spec_upstreams import BreakerSpec, UpstreamLimit
from taskstream.ratelimit.breaker import Outcome
from taskstream.ratelimit.breaker_config import (
    BreakerConfig,
    breaker_config,
    upstream_breaker_config,
)
from taskstream.ratelimit.memory import MemoryBreakers
from taskstream.ratelimit.window import Limits, limits_from_spec
from taskstream.runtime.upstream_holds import BreakerHolds

NOW = 1_780_000_000_000
DEFAULT = BreakerConfig(failure_threshold=1, cooldown_ms=30_000)


def test_the_default_spec_converts_to_the_default_config() -> None:
    assert breaker_config(BreakerSpec()) == BreakerConfig()


def test_every_key_converts_with_durations_in_whole_ms() -> None:
    spec = BreakerSpec(
        failures=3,
        failure_rate=0.25,
        min_calls=20,
        rate_window=120.0,
        cooldown=1.5,
        probes=2,
        probe_timeout=45.0,
    )
    assert breaker_config(spec) == BreakerConfig(
        failure_threshold=3,
        failure_rate=0.25,
        window_ms=120_000,
        min_calls=20,
        cooldown_ms=1_500,
        probes=2,
        probe_timeout_ms=45_000,
    )


@pytest.mark.parametrize(
    ("seconds", "ms"), [(0.001, 1), (0.0014, 1), (0.0015, 2), (0.25, 250), (86_400.0, 86_400_000)]
)
def test_durations_round_to_ms_and_never_to_zero(seconds: float, ms: int) -> None:
    cfg = breaker_config(BreakerSpec(cooldown=seconds, rate_window=seconds, probe_timeout=seconds))
    assert (cfg.cooldown_ms, cfg.window_ms, cfg.probe_timeout_ms) == (ms, ms, ms)


@pytest.mark.parametrize(
    ("upstream", "want"),
    [
        (None, DEFAULT),
        (UpstreamLimit(limit=5, window=60.0), DEFAULT),
        (UpstreamLimit(breaker=BreakerSpec(cooldown=5.0)), BreakerConfig(cooldown_ms=5_000)),
    ],
)
def test_an_upstream_without_its_own_breaker_uses_the_default(
    upstream: UpstreamLimit | None, want: BreakerConfig
) -> None:
    assert upstream_breaker_config(upstream, DEFAULT) == want


def test_an_upstream_without_a_rate_limit_has_no_limits() -> None:
    assert limits_from_spec(UpstreamLimit(breaker=BreakerSpec())) is None
    assert limits_from_spec(UpstreamLimit()) is None
    assert limits_from_spec(UpstreamLimit(limit=5, window=60.0, burst=1)) == Limits(5, 60_000, 1)


# --- stored configs, read again on an interval ------------------------------------------------


class Stored:
    """The store's `list_upstreams`, counting reads; `down` makes the next read fail."""

    def __init__(self, configs: dict[str, dict[str, Any]]) -> None:
        self.configs, self.reads, self.down = configs, 0, False

    async def list_upstreams(self) -> dict[str, dict[str, Any]]:
        await asyncio.sleep(0)  # a real read yields to other tasks while it waits
        if self.down:
            raise StoreUnavailable("database is down")
        self.reads += 1
        return self.configs


async def test_the_cache_reads_the_store_at_most_once_per_interval() -> None:
    store = Stored({"llm": {"limit": 5, "window": 60.0, "burst": None}})
    cache = UpstreamCache(store, min_interval_s=3600)
    assert await cache.refresh()
    assert not await cache.refresh()
    assert store.reads == 1
    assert cache.specs == {"llm": UpstreamLimit(limit=5, window=60.0)}


async def test_no_caller_goes_on_with_nothing_loaded_while_the_first_read_runs() -> None:
    store = Stored({"llm": {"limit": 5, "window": 60.0, "burst": None}})
    cache = UpstreamCache(store, min_interval_s=3600)
    seen: list[dict[str, UpstreamLimit]] = []

    async def caller() -> None:
        await cache.refresh()
        seen.append(dict(cache.specs))

    await asyncio.gather(caller(), caller())
    assert seen == [{"llm": UpstreamLimit(limit=5, window=60.0)}] * 2


async def test_a_failed_read_is_tried_again_at_the_next_call() -> None:
    store = Stored({"llm": {"limit": 5, "window": 60.0, "burst": None}})
    cache = UpstreamCache(store, min_interval_s=3600)
    store.down = True
    with pytest.raises(StoreUnavailable):
        await cache.refresh()
    store.down = False
    assert await cache.refresh()
    assert list(cache.specs) == ["llm"]


async def test_the_cache_lists_invalid_configs_apart() -> None:
    store = Stored({"llm": {"breaker": {"cooldown": 5}}, "bad": {"limit": 0, "window": 1}})
    cache = UpstreamCache(store, min_interval_s=0)
    await cache.refresh()
    assert cache.specs == {"llm": UpstreamLimit(breaker=BreakerSpec(cooldown=5.0))}
    assert cache.invalid == {
        "bad": "stored upstream 'bad': limit: Input should be greater than or equal to 1"
    }


async def test_holds_use_each_upstreams_own_cool_down() -> None:
    clock = FixedClock(NOW)
    breakers = MemoryBreakers(clock)
    store = Stored(
        {
            "llm": {"breaker": {"failures": 1, "cooldown": 5}},
            "web": {"limit": 5, "window": 60.0, "burst": None},
        }
    )
    holds = BreakerHolds(breakers, DEFAULT, UpstreamCache(store, min_interval_s=0))
    await breakers.record(
        "llm", Outcome.FAILURE, BreakerConfig(failure_threshold=1), probe_round=None
    )
    await breakers.record(
        "web", Outcome.FAILURE, DEFAULT, probe_round=None
    )  # stored without breaker
    await breakers.record("db", Outcome.FAILURE, DEFAULT, probe_round=None)  # nothing stored
    clock.advance(1_000)
    assert await holds.held(["llm", "web", "db"]) == {"llm": 4_000, "web": 29_000, "db": 29_000}
    clock.advance(4_000)
    assert await holds.held(["llm", "web"]) == {"web": 25_000}


async def test_holds_keep_the_last_settings_when_the_store_is_down() -> None:
    clock = FixedClock(NOW)
    breakers = MemoryBreakers(clock)
    store = Stored({"llm": {"breaker": {"cooldown": 5}}})
    holds = BreakerHolds(breakers, DEFAULT, UpstreamCache(store, min_interval_s=0))
    await breakers.record("llm", Outcome.FAILURE, DEFAULT, probe_round=None)
    assert await holds.held(["llm"]) == {"llm": 5_000}
    store.down = True
    assert await holds.held(["llm"]) == {"llm": 5_000}
