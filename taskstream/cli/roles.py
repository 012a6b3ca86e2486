"""Long-running roles: `up`, `scheduler`, `executor`, and `migrate`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer

from taskstream.agents.registry import default_registry
from taskstream.cli.common import err_console, keys_of, open_cluster, run_async, settings
from taskstream.core import streams
from taskstream.core.clock import SystemClock
from taskstream.core.definitions import to_records
from taskstream.core.logging import get_logger
from taskstream.core.settings import Settings
from taskstream.core.spec import TaskFile
from taskstream.core.specfile import load_task_file
from taskstream.core.store.migrate import upgrade
from taskstream.executor.service import Executor, ExecutorConfig, consumer_name
from taskstream.runtime import endpoint
from taskstream.runtime.embedded import EmbeddedValkey
from taskstream.runtime.supervisor import Child, Supervisor, install_stop_signals, role_argv
from taskstream.scheduler.outbox import Outbox
from taskstream.scheduler.service import Scheduler, SchedulerConfig


def migrate_cmd() -> None:
    """Create or upgrade the store's tables (idempotent)."""
    s = settings()
    url = endpoint.resolve(s, need_redis=False).database_url
    run_async(upgrade(url))
    err_console.print("store is at the latest schema")


def scheduler_cmd() -> None:
    """Run one scheduler until SIGINT/SIGTERM."""
    run_async(_scheduler(settings()))


async def _scheduler(s: Settings) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    async with open_cluster(s) as cluster:
        await streams.ensure_groups(cluster.queue, cluster.keys)
        outbox = Outbox(cluster.store, cluster.queue, cluster.keys)
        config = SchedulerConfig(max_sleep_s=s.scheduler_max_sleep_s)
        await Scheduler(cluster.store, outbox, SystemClock(), config).run(stop)


def executor_cmd(
    concurrency: int = typer.Option(None, help="Runs at once (default from settings)."),
) -> None:
    """Run one executor until SIGINT/SIGTERM; in-flight runs finish within the grace."""
    run_async(_executor(settings(), concurrency))


async def _executor(s: Settings, concurrency: int | None) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    config = ExecutorConfig(
        consumer=consumer_name(SystemClock().now_ms()),
        concurrency=concurrency or s.executor_concurrency,
        block_ms=s.read_block_ms,
        grace_s=s.shutdown_grace_s,
        max_payload_bytes=s.max_payload_bytes,
    )
    async with open_cluster(s) as cluster:
        executor = Executor(cluster.store, cluster.queue, keys_of(s), default_registry(), config)
        await executor.run(stop)


def up_cmd(
    tasks: Path = typer.Option(Path("tasks.yaml"), "--tasks", help="Task file to apply first."),
    executors: int = typer.Option(2, min=0, max=64, help="Executor processes."),
    concurrency: int = typer.Option(None, help="Runs at once per executor."),
) -> None:
    """Run the whole cluster on this host; embedded Valkey + SQLite when no URLs are set."""
    taskfile = None
    if tasks.exists():
        taskfile = load_task_file(tasks, known_agents=default_registry().names())
    else:
        get_logger(role="supervisor").warning("tasks.file_missing", path=str(tasks))
    run_async(_up(settings(), taskfile, executors, concurrency))


async def _up(
    s: Settings, taskfile: TaskFile | None, executors: int, concurrency: int | None
) -> None:
    log = get_logger(role="supervisor")
    valkey = EmbeddedValkey(s.home) if s.redis_url is None else None
    redis_url = valkey.start() if valkey else s.redis_url
    try:
        eps = endpoint.Endpoints(
            redis_url=redis_url or "", database_url=s.database_url or endpoint.sqlite_url(s.home)
        )
        await upgrade(eps.database_url)
        if taskfile is not None:
            await _apply(s, eps, taskfile)
        endpoint.write(s.home, eps, os.getpid())
        extra = ["--concurrency", str(concurrency)] if concurrency else []
        children = [Child("scheduler", role_argv("scheduler"))] + [
            Child(f"executor-{i}", role_argv("executor", *extra)) for i in range(executors)
        ]
        stop = asyncio.Event()
        install_stop_signals(stop)
        log.info("cluster.up", executors=executors, home=str(s.home), embedded=valkey is not None)
        await Supervisor(eps, children, s.shutdown_grace_s).run(stop)
    finally:
        endpoint.remove(s.home, os.getpid())
        if valkey:
            valkey.stop()


async def _apply(s: Settings, eps: endpoint.Endpoints, taskfile: TaskFile) -> None:
    s2 = s.model_copy(update={"database_url": eps.database_url, "redis_url": eps.redis_url})
    async with open_cluster(s2, need_redis=False) as cluster:
        changes = await cluster.store.upsert_definitions(to_records(taskfile))
    get_logger(role="supervisor").info("tasks.applied", changes=changes)
