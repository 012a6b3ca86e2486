"""`taskstream up`: the whole cluster on one host as child processes of one supervisor.

Children are `taskstream scheduler`, `taskstream sweeper` and N x `taskstream executor`,
started with the resolved URLs in their environment. A child that dies is restarted after
1, 2, 4 and 8 s, then every 16 s (counting its restarts over the supervisor's life). On
SIGINT or SIGTERM every child gets SIGTERM, may finish in-flight work within the grace, and
is killed after it; the whole stop takes at most `grace_s + 1` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field

from taskstream.core.logging import get_logger
from taskstream.runtime.endpoint import Endpoints

MAX_RESTART_DELAY_S = 16.0


@dataclass(slots=True)
class Child:
    """One supervised role process."""

    name: str
    argv: list[str]
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    stopping: bool = field(default=False)


def restart_delay_s(restarts: int) -> float:
    """Seconds to wait before a child's `restarts`-th restart (1-based): 1, 2, 4, 8, then 16."""
    return min(MAX_RESTART_DELAY_S, 2.0 ** min(max(restarts, 1) - 1, 8))


def role_argv(role: str, *extra: str) -> list[str]:
    """Command line of a role process: this interpreter running the taskstream CLI."""
    return [sys.executable, "-m", "taskstream", role, *extra]


class Supervisor:
    """Starts, watches and stops the role processes of `taskstream up`."""

    def __init__(self, endpoints: Endpoints, children: list[Child], grace_s: float) -> None:
        self._env = {
            **os.environ,
            "TASKSTREAM_REDIS_URL": endpoints.redis_url,
            "TASKSTREAM_DATABASE_URL": endpoints.database_url,
        }
        self._children = children
        self._grace_s = grace_s
        self._log = get_logger(role="supervisor")

    async def run(self, stop: asyncio.Event) -> None:
        """Run the children until `stop` is set, then stop them all."""
        watchers = [asyncio.create_task(self._watch(c, stop)) for c in self._children]
        await stop.wait()
        await self._stop_all()
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)

    async def _watch(self, child: Child, stop: asyncio.Event) -> None:
        while not stop.is_set():
            child.proc = await asyncio.create_subprocess_exec(*child.argv, env=self._env)
            self._log.info("child.started", child=child.name, pid=child.proc.pid)
            code = await child.proc.wait()
            if stop.is_set() or child.stopping:
                return
            child.restarts += 1
            delay = restart_delay_s(child.restarts)
            self._log.warning("child.exited", child=child.name, code=code, restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _stop_all(self) -> None:
        live = [c for c in self._children if c.proc and c.proc.returncode is None]
        for child in live:
            child.stopping = True
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        waits = [asyncio.ensure_future(c.proc.wait()) for c in live if c.proc]
        # Every child may be dead already, waiting for its restart: nothing to wait for.
        _, pending = await asyncio.wait(waits, timeout=self._grace_s) if waits else ((), ())
        for child in live:
            if child.proc and child.proc.returncode is None:
                self._log.warning("child.killed", child=child.name)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        self._log.info("supervisor.stopped", children=len(live))


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set `stop` (once; a second signal changes nothing)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
