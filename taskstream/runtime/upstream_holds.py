"""The scheduler's view of the shared circuit breakers (DESIGN.md §8).

The scheduler holds back ticks whose upstream breaker is open (`scheduler.hold`), but the
import rule keeps `scheduler` from importing `ratelimit`; this adapter, built by the
composition root, implements the scheduler's `UpstreamHolds` port over a `Breakers` backend.
It reads the states and the backend's clock together (`Breakers.states`: one MULTI/EXEC of
`TIME` and the hashes on Redis), so the cool-down left is measured on the same clock that
started it, and the scheduler's own clock (aligned to the database) never has to agree with
the Redis server's. Reading changes nothing: an open breaker past its cool-down stays open
until an executor's probe is admitted.

Each breaker's cool-down is that upstream's stored `breaker:` setting, read from the store as
often as the executors read it (`UpstreamCache`), so the scheduler holds a tick exactly as long
as the executors refuse calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskstream.core.definitions import UpstreamCache
from taskstream.core.errors import StoreError
from taskstream.core.logging import get_logger
from taskstream.ratelimit.backend import Breakers
from taskstream.ratelimit.breaker import cooldown_left_ms
from taskstream.ratelimit.breaker_config import BreakerConfig, upstream_breaker_config


class BreakerHolds:
    """`scheduler.hold.UpstreamHolds` over the breakers the executors use.

    `config` must be the default `BreakerConfig` the executors admit with (its `cooldown_ms` is
    how long an open breaker refuses); with `upstreams`, an upstream's stored `breaker:`
    settings take its place, as they do in the executors. Backend errors propagate as
    `GuardUnavailable` (a `QueueUnavailable`); when the store cannot be read the settings last
    read stay in use.
    """

    def __init__(
        self, breakers: Breakers, config: BreakerConfig, upstreams: UpstreamCache | None = None
    ) -> None:
        self._breakers, self._config, self._upstreams = breakers, config, upstreams
        self._log = get_logger(role="scheduler")

    async def _refresh(self) -> None:
        if self._upstreams is None:
            return
        try:
            await self._upstreams.refresh()
        except StoreError as exc:  # stale settings hold ticks better than none
            self._log.warning("upstream.configs_unread", error=str(exc)[:300])

    def _config_of(self, name: str) -> BreakerConfig:
        spec = self._upstreams.specs.get(name) if self._upstreams is not None else None
        return upstream_breaker_config(spec, self._config)

    async def held(self, upstreams: Sequence[str]) -> dict[str, int]:
        names = list(dict.fromkeys(upstreams))
        if not names:
            return {}
        await self._refresh()
        read = await self._breakers.states(names)
        left = {
            name: cooldown_left_ms(state, read.at_ms, self._config_of(name))
            for name, state in read.states.items()
        }
        return {name: ms for name, ms in left.items() if ms > 0}
