"""`taskstream up`: the whole cluster on this host."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import typer

from taskstream.agents.registry import default_registry
from taskstream.cli.common import open_cluster, run_async, settings
from taskstream.cli.tasks_cmds import load_checked
from taskstream.core import preconditions
from taskstream.core.definitions import apply_file
from taskstream.core.logging import get_logger
from taskstream.core.settings import Settings
from taskstream.core.spec import TaskFile
from taskstream.runtime import endpoint
from taskstream.runtime.embedded import EmbeddedValkey
from taskstream.runtime.lifetime import HomeLock, import_as_children
from taskstream.runtime.supervisor import Child, Supervisor, install_stop_signals, role_argv

DEFAULT_TASKS = Path("tasks.yaml")


def up_cmd(
    tasks: Path = typer.Option(
        None, "--tasks", help=f"Task file to apply first (default: {DEFAULT_TASKS}, if present)."
    ),
    executors: int = typer.Option(2, min=0, max=64, help="Executor processes."),
    concurrency: int = typer.Option(
        None,
        min=1,
        max=1024,
        help="Runs at once per executor (default: TASKSTREAM_EXECUTOR_CONCURRENCY, 4).",
    ),
) -> None:
    """Run the whole cluster on this host; embedded Valkey + SQLite when no URLs are set."""
    if tasks is not None and not tasks.is_file():
        raise typer.BadParameter(f"no task file at {tasks}", param_hint="--tasks")
    path = tasks or DEFAULT_TASKS
    s = settings()
    run_async(_up(s, _checked(path, s), executors, concurrency))


def _checked(path: Path, s: Settings) -> TaskFile | None:
    """The task file at `path` checked, or None when there is none. The modules the roles
    load are checked either way, as the roles import them: else each child would exit on a
    bad one and be started again, for ever, while `up` looked healthy."""
    with import_as_children():
        if path.exists():
            return load_checked(path, s)
        # Without a task file the cluster runs the definitions stored before.
        default_registry(s.agent_modules)
        preconditions.load(s.precondition_modules)
    get_logger(role="supervisor").warning("tasks.file_missing", path=str(path))
    return None


async def _up(
    s: Settings, taskfile: TaskFile | None, executors: int, concurrency: int | None
) -> None:
    # Alembic takes a third of a second to import: only the commands that migrate pay it.
    from taskstream.core.store.migrate import upgrade  # noqa: PLC0415

    log = get_logger(role="supervisor")
    # Before anything starts: a SIGTERM while it starts (a database that does not answer the
    # migration, say) must still stop what was started, through the `finally` below.
    stop = asyncio.Event()
    install_stop_signals(stop)
    with HomeLock(s.home):
        valkey = EmbeddedValkey(s.home) if s.redis_url is None else None
        redis_url = valkey.start() if valkey else s.redis_url
        try:
            eps = endpoint.Endpoints(
                redis_url=redis_url or "",
                database_url=endpoint.anchored(s.database_url)
                if s.database_url
                else endpoint.private_sqlite(s.home),
            )
            if not await _unless_stopped(stop, _prepare(s, eps, taskfile, upgrade)):
                return
            endpoint.write(s.home, eps, os.getpid())
            extra = ["--concurrency", str(concurrency)] if concurrency else []
            children = [
                Child("scheduler", role_argv("scheduler")),
                Child("sweeper", role_argv("sweeper")),
            ] + [Child(f"executor-{i}", role_argv("executor", *extra)) for i in range(executors)]
            embedded = valkey is not None
            log.info("cluster.up", executors=executors, home=str(s.home), embedded=embedded)
            keeper = asyncio.create_task(valkey.keep(stop)) if valkey else None
            await Supervisor(eps, children, s.shutdown_grace_s).run(stop)
            if keeper is not None:
                await keeper  # `stop` is set: it ends once a restart under way is done
        finally:
            endpoint.remove(s.home, os.getpid())
            if valkey:
                valkey.stop()


async def _prepare(
    s: Settings,
    eps: endpoint.Endpoints,
    taskfile: TaskFile | None,
    upgrade: Callable[[str], Awaitable[None]],
) -> None:
    """Migrate the store and apply the task file, if one is given."""
    await upgrade(eps.database_url)
    if taskfile is not None:
        await _apply(s, eps, taskfile)


async def _unless_stopped(stop: asyncio.Event, step: Awaitable[None]) -> bool:
    """Run `step` to its end (True), or cancel it when `stop` is set first (False)."""
    work = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        get_logger(role="supervisor").info("cluster.stopped_while_starting")
        return False
    work.result()
    return True


async def _apply(s: Settings, eps: endpoint.Endpoints, taskfile: TaskFile) -> None:
    s2 = s.model_copy(update={"database_url": eps.database_url, "redis_url": eps.redis_url})
    async with open_cluster(s2, need_redis=False) as cluster:
        changes = await apply_file(cluster.store, taskfile)
    get_logger(role="supervisor").info("tasks.applied", changes=changes)
