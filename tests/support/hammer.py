"""A hammer process: concurrent callers of one upstream through the product's own path.

Run as `python -m tests.support.hammer '<HammerConfig as JSON>'`. Each caller loops until the
run's time is up: one `UpstreamClient` call per turn, bound to the executor's `UpstreamGate`
(`gate.bind(())`: every call is admitted on its own) over `RedisLimiter` and `RedisBreakers`,
with the limits the gate reads from the store. A refused call (`UpstreamDeferred`) waits its
`retry_after_ms` and tries again, as a deferred run does.

The process speaks one JSON line at a time on stdout:

1. `{"ready": true, "pid": ..., "wall_s": time.time(), "mono_s": time.monotonic()}` once Redis
   and the store answer (the parent compares `wall_s` with its own clock to see a fake one);
2. then it waits for one line on stdin (any text) and runs for `seconds` of monotonic time
   (stdin closing instead ends the process without a call);
3. `{"calls": ..., "deferred": ..., "errors": [...]}` at the end, then it exits.

Logs (warnings only) go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field

import httpx
from pydantic import BaseModel

from taskstream.agents.errors import AgentError, UpstreamDeferred
from taskstream.agents.upstream import UpstreamClient
from taskstream.core import logging as ts_logging
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter

CALL_TIMEOUT_S = 10.0


class HammerConfig(BaseModel):
    """Where to find the cluster and the upstream, and how hard to call it."""

    redis_url: str
    database_url: str
    namespace: str
    key_prefix: str = "ts"
    url: str
    upstream: str
    callers: int
    seconds: float


@dataclass
class Tally:
    calls: int = 0
    deferred: int = 0
    errors: list[str] = field(default_factory=list)


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _caller(
    gate: UpstreamGate, http: httpx.AsyncClient, cfg: HammerConfig, deadline: float, tally: Tally
) -> None:
    """Call until `deadline` (monotonic s); a failed call ends this caller (it is reported)."""
    while (left := deadline - time.monotonic()) > 0:
        client = UpstreamClient(gate.bind(()), http=http, timeout_s=CALL_TIMEOUT_S)
        try:
            await client.get(cfg.url, upstream=cfg.upstream)
        except UpstreamDeferred as exc:
            tally.deferred += 1
            await asyncio.sleep(min(exc.retry_after_ms / 1000, left))
            continue
        except AgentError as exc:
            tally.errors.append(f"{type(exc).__name__}: {exc}")
            return
        tally.calls += 1


async def hammer(cfg: HammerConfig) -> Tally:
    """Connect, report ready, wait for the go line, call for `cfg.seconds`."""
    store = await SqlStore.connect(cfg.database_url)
    redis = streams.connect(cfg.redis_url)
    keys = Keys(prefix=cfg.key_prefix, namespace=cfg.namespace)
    gate = UpstreamGate(store, RedisLimiter(redis, keys), RedisBreakers(redis, keys))
    tally = Tally()
    try:
        await redis.ping()
        await store.ping()
        _say(ready=True, pid=os.getpid(), wall_s=time.time(), mono_s=time.monotonic())
        if not await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline):
            return tally  # stdin closed before the go line: the parent has gone
        deadline = time.monotonic() + cfg.seconds
        async with httpx.AsyncClient(follow_redirects=False) as http:
            await asyncio.gather(
                *(_caller(gate, http, cfg, deadline, tally) for _ in range(cfg.callers))
            )
    finally:
        await redis.aclose()
        await store.close()
    return tally


def main() -> None:
    ts_logging.configure("warning", sys.stderr)
    cfg = HammerConfig.model_validate_json(sys.argv[1])
    tally = asyncio.run(hammer(cfg))
    _say(calls=tally.calls, deferred=tally.deferred, errors=tally.errors)


if __name__ == "__main__":
    main()
