"""Long-running roles: `scheduler`, `executor`, `sweeper`, and `migrate`.

Each role opens the cluster, aligns its clock with the database clock, and runs its service
until SIGINT, SIGTERM or SIGHUP.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable
from random import Random
from typing import Protocol

import typer

from taskstream.agents.registry import default_registry
from taskstream.cli.common import Cluster, err_console, open_cluster, run_async, settings
from taskstream.core import preconditions, redis_needs, streams
from taskstream.core.clock import Clock, OffsetClock, SystemClock
from taskstream.core.definitions import UpstreamCache
from taskstream.core.denials import log_denied
from taskstream.core.errors import ConfigError, StoreUnavailable, WrongType
from taskstream.core.futures import unless_stopped
from taskstream.core.logging import get_logger
from taskstream.core.notify import Wakeups
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import Keys
from taskstream.core.settings import Settings
from taskstream.core.timesync import keep_synced, synced_clock
from taskstream.executor.admission import RELOAD_S, UpstreamGate
from taskstream.executor.exits import contain_exits
from taskstream.executor.service import Executor, ExecutorConfig, ExecutorDeps, consumer_name
from taskstream.executor.sweeper import Sweeper, SweeperConfig
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.runtime import endpoint
from taskstream.runtime.supervisor import install_stop_signals
from taskstream.runtime.upstream_holds import BreakerHolds
from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig

GC_YOUNG_THRESHOLD = 50_000
"""Net allocations between young-generation collections in the long-running roles (CPython's
default is 700). An executor keeps a few thousand young objects alive per batch of runs
(rows, runs, tasks, futures), so at 700 the collector re-scanned them every few runs: 12 % of
an executor's CPU in a 20,000-instance drain, and none at this threshold. Reference counting
frees everything else; cyclic garbage waits for at most this many allocations."""


START_PAUSE_S = 1.0
"""Pause between tries to reach Redis and the store when a role starts during an outage."""


Needs = Callable[[Keys], list[redis_needs.Call]]
"""The Redis calls a role makes, for the start-up check (`redis_needs`)."""


class Service(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def migrate_cmd() -> None:
    """Create or upgrade the store's tables (idempotent)."""
    # Alembic takes a third of a second to import: only the commands that migrate pay it.
    from taskstream.core.store.migrate import upgrade  # noqa: PLC0415

    url = endpoint.resolve(settings(), need_redis=False).database_url
    run_async(upgrade(url))
    err_console.print("store is at the latest schema")


async def _serve(
    s: Settings, build: Callable[[Cluster, Clock], Service], role: str, calls: Needs
) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    async with open_cluster(s, check=False) as cluster:
        clock = await _dependencies_up(cluster, stop, role, calls)
        if clock is None:
            return  # stopped while waiting
        syncing = asyncio.create_task(keep_synced(cluster.store, clock, stop))
        service = build(cluster, clock)
        # Everything alive now (modules, settings, connections) lives as long as the process:
        # keep it out of the cyclic collector's passes, which otherwise re-scan it every full
        # collection while runs allocate briskly.
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        try:
            await service.run(stop)
        finally:
            stop.set()
            await syncing


async def _dependencies_up(
    cluster: Cluster, stop: asyncio.Event, role: str, calls: Needs
) -> OffsetClock | None:
    """Redis checked to allow the role's commands (`redis_needs`), the stream groups made and
    the clock synced with the database's, waiting while Redis or the store is down (a warning
    each try, `START_PAUSE_S` apart), as the services wait for an outage later on; None when
    `stop` comes first. `ConfigError` naming each command Redis refuses the role's user. A
    work-stream key of another type is logged (`redis.wrong_type`) and the role starts: it
    pauses that stream's work alone."""
    log = get_logger(role="startup")
    while not stop.is_set():
        try:
            if refused := await redis_needs.refusals(cluster.queue, calls(cluster.keys)):
                raise not_allowed(role, refused)
            try:
                await streams.ensure_groups(cluster.queue, cluster.keys)
            except WrongType as exc:  # the role starts: it pauses that stream's work alone
                log_denied(log, exc)
            return await unless_stopped(synced_clock(cluster.store), stop)
        except (StoreUnavailable, *streams.DRIVER_ERRORS) as exc:
            log.warning("startup.dependency_down", error=streams.outage_text(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=START_PAUSE_S)
    return None


def not_allowed(role: str, refused: list[redis_needs.Refusal]) -> ConfigError:
    """The start-up error of a role whose Redis user may not run some of its commands."""
    return ConfigError(
        [
            *(f"redis refuses the {role} {r.command}: {r.reply}" for r in refused),
            f"the {role} needs these commands (its Redis user's ACL, or a rename-command in "
            "the server's config): see 'Redis permissions' in docs/operations.md",
        ]
    )


def scheduler_cmd() -> None:
    """Run one scheduler until SIGINT, SIGTERM or SIGHUP."""
    s = settings()

    checks = preconditions.load(s.precondition_modules)
    owner = consumer_name(SystemClock().now_ms())

    def build(cluster: Cluster, clock: Clock) -> Service:
        outbox = Outbox(cluster.store, cluster.queue, cluster.keys)
        config = SchedulerConfig(max_sleep_s=s.scheduler_max_sleep_s)
        lease = LeaderLease(
            cluster.queue, cluster.keys, owner, lease_ms=round(s.scheduler_lease_s * 1000)
        )
        wakeups = Wakeups(cluster.queue, cluster.keys)
        # As the executors' UpstreamGate: each upstream's stored breaker settings, read again
        # every RELOAD_S, else the default BreakerConfig.
        holds = BreakerHolds(
            RedisBreakers(cluster.queue, cluster.keys),
            BreakerConfig(),
            UpstreamCache(cluster.store, min_interval_s=RELOAD_S),
        )
        return Scheduler(
            cluster.store,
            outbox,
            clock,
            config,
            leader=lease,
            checks=checks,
            wakeups=wakeups,
            holds=holds,
        )

    run_async(_serve(s, build, "scheduler", redis_needs.scheduler_calls))


def executor_cmd(
    concurrency: int = typer.Option(
        None,
        min=1,
        max=1024,
        help="Runs at once (default: TASKSTREAM_EXECUTOR_CONCURRENCY, 4).",
    ),
) -> None:
    """Run one executor until SIGINT, SIGTERM or SIGHUP; in-flight runs finish within the grace."""
    s = settings()
    config = ExecutorConfig(
        consumer=consumer_name(SystemClock().now_ms()),
        concurrency=s.executor_concurrency if concurrency is None else concurrency,
        block_ms=s.read_block_ms,
        grace_s=s.shutdown_grace_s,
        max_payload_bytes=s.max_payload_bytes,
        liveness_ttl_s=s.liveness_ttl_s,
    )

    def build(cluster: Cluster, clock: Clock) -> Service:
        # sys.exit() in a task an agent starts fails that agent's run, not the process.
        asyncio.get_running_loop().set_task_factory(contain_exits)
        deps = ExecutorDeps(
            cluster.store,
            cluster.queue,
            cluster.keys,
            default_registry(s.agent_modules),
            clock,
            Random(),
            UpstreamGate(
                cluster.store,
                RedisLimiter(cluster.queue, cluster.keys),
                RedisBreakers(cluster.queue, cluster.keys),
            ),
        )
        return Executor(deps, config)

    run_async(_serve(s, build, "executor", redis_needs.executor_calls))


def sweeper_cmd() -> None:
    """Run one sweeper until SIGINT, SIGTERM or SIGHUP: reclaims stuck entries, republishes
    lost work."""
    s = settings()
    config = SweeperConfig(
        interval_s=s.sweep_interval_s,
        max_deliveries=s.max_deliveries,
        liveness_ttl_ms=round(s.liveness_ttl_s * 1000),
    )

    def build(cluster: Cluster, clock: Clock) -> Service:
        return Sweeper(cluster.store, cluster.queue, cluster.keys, clock, config)

    run_async(_serve(s, build, "sweeper", redis_needs.sweeper_calls))
