"""`taskstream up`: the whole cluster on one host as child processes of one supervisor.

Children are `taskstream scheduler`, `taskstream sweeper` and N x `taskstream executor`,
started with the resolved URLs in their environment. A child that dies is restarted after
1, 2, 4 and 8 s, then every 16 s (counting its restarts over the supervisor's life). On
SIGINT, SIGTERM or SIGHUP every child gets SIGTERM and may finish in-flight work within the grace
(counted from the SIGTERM); an executor may take `STOP_STEPS_S` to begin its drain, and then
still has to release the runs that outlived the grace and commit, so a child is killed only
`KILL_MARGIN_S` after the later of the two (`kill_after_s`). The whole stop takes at most
`kill_after_s(grace_s) + 1` seconds. Children get SIGTERM too when the supervisor dies
(`lifetime.guarded`). The terminal's Ctrl-C, sent to the children too, is theirs to ignore
(`lifetime.InterruptsHeld`): the supervisor's SIGTERM stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field

from taskstream.core.futures import CANCEL_WAIT_S, STEP_END_S
from taskstream.core.logging import get_logger
from taskstream.runtime.endpoint import Endpoints
from taskstream.runtime.lifetime import (
    InterruptsHeld,
    guarded,
    interrupts_ignored,
    python_module,
)

MAX_RESTART_DELAY_S = 16.0
KILL_MARGIN_S = 2.0
"""Seconds a child may take past the grace before it is killed: an executor releases the runs
that outlived the grace (one store write) and commits those that ended in it."""
STOP_STEPS_S = 2 * STEP_END_S + CANCEL_WAIT_S
"""Longest an executor takes from its SIGTERM to its drain (s): the step under way ends or is
cut off (`STEP_END_S`, then `CANCEL_WAIT_S`), and a claim it left under way gets `STEP_END_S`
to land, so that it is handed back."""


def kill_after_s(grace_s: float) -> float:
    """Seconds after its SIGTERM a child still running is killed: the grace (an executor
    counts it from the SIGTERM) or the executor's steps before its drain, whichever ends
    later, then `KILL_MARGIN_S` for its releases and last commits."""
    return max(grace_s, STOP_STEPS_S) + KILL_MARGIN_S


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
    return python_module("taskstream", role, *extra)


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
        self._held = InterruptsHeld()

    async def run(self, stop: asyncio.Event) -> None:
        """Run the children until `stop` is set, then stop them all."""
        watchers = [asyncio.create_task(self._watch(c, stop)) for c in self._children]
        await stop.wait()
        stopped = await self._stop_all()
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        # A child (re)started while the stop arrived was not among those just stopped.
        stopped += await self._stop_all()
        self._log.info("supervisor.stopped", children=stopped)

    async def _watch(self, child: Child, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                with self._held():
                    child.proc = await asyncio.create_subprocess_exec(
                        *guarded(child.argv), env=self._env
                    )
            except OSError as exc:  # EAGAIN, EMFILE, ENOMEM: tried again after the delay
                child.proc = None
                code: int | str = f"start failed: {exc}"
            else:
                self._log.info("child.started", child=child.name, pid=child.proc.pid)
                if stop.is_set():
                    return  # started as the stop arrived: `run` stops it after the others
                code = await child.proc.wait()
            if stop.is_set() or child.stopping:
                return
            child.restarts += 1
            delay = restart_delay_s(child.restarts)
            self._log.warning("child.exited", child=child.name, code=code, restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _stop_all(self) -> int:
        """SIGTERM every running child not yet told to stop, kill those still running
        `kill_after_s(grace)` later; how many were told."""
        live = [
            c for c in self._children if c.proc and c.proc.returncode is None and not c.stopping
        ]
        if not live:
            return 0
        for child in live:
            child.stopping = True
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        waits = [asyncio.ensure_future(c.proc.wait()) for c in live if c.proc]
        _, pending = await asyncio.wait(waits, timeout=kill_after_s(self._grace_s))
        for child in live:
            if child.proc and child.proc.returncode is None:
                self._log.warning("child.killed", child=child.name)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        return len(live)


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal, a dropped SSH session) set `stop`
    (once; a second signal changes nothing): each is a clean stop, runs released. SIGINT is
    left ignored in a process that is to ignore it (a role `up` started, which `up` stops
    with SIGTERM; `lifetime.interrupts_ignored`)."""
    loop = asyncio.get_running_loop()
    interrupts = () if interrupts_ignored() else (signal.SIGINT,)
    for sig in (*interrupts, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
