"""The supervisor of `taskstream up`, with real child processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from taskstream.runtime import supervisor
from taskstream.runtime.endpoint import Endpoints
from taskstream.runtime.lifetime import guarded
from taskstream.runtime.supervisor import Child, Supervisor
from tests.integration.harness import until


async def test_a_stop_while_every_child_waits_for_its_restart_ends_cleanly() -> None:
    """A child that exits at once (its Redis is down, say) waits for its restart; a stop then
    finds no live child to wait for, and must still end cleanly."""
    child = Child("executor-1", [sys.executable, "-c", "raise SystemExit(3)"])
    endpoints = Endpoints("redis://127.0.0.1:1/0", "sqlite:///nothing.db")
    stop = asyncio.Event()
    running = asyncio.create_task(Supervisor(endpoints, [child], grace_s=1).run(stop))

    async def waiting_to_restart() -> bool:
        return child.restarts >= 1

    await until(waiting_to_restart)
    stop.set()
    await asyncio.wait_for(running, timeout=10)  # raised ValueError on an empty wait before
    assert child.proc is not None and child.proc.returncode == 3


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def slow_to_stop(ready: Path) -> list[str]:
    """A child that takes half a second to stop on SIGTERM; `ready` appears once it would."""
    code = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, "-c", code]


async def test_a_child_started_as_the_stop_arrives_is_stopped_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGINT/SIGTERM reaches `up` just as it (re)starts a child: the process exists but its
    start has not returned, so the first round of stopping, still waiting for a slow child,
    does not see it. It is stopped all the same, and outlives no one."""
    stop = asyncio.Event()
    real_exec = asyncio.create_subprocess_exec
    ready = tmp_path / "ready"
    other = Child("scheduler", slow_to_stop(ready))
    late = Child("executor-0", SLEEPER)
    spawned: list[asyncio.subprocess.Process] = []

    async def other_ready() -> bool:
        return ready.exists()

    async def exec_(*argv: Any, **kw: Any) -> asyncio.subprocess.Process:
        proc = await real_exec(*argv, **kw)
        spawned.append(proc)
        if len(spawned) == 2:  # the second child: forked, not handed back yet
            await until(other_ready)
            stop.set()  # the signal lands here
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:  # as asyncio itself does when cancelled mid-start
                proc.kill()
                raise
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", exec_)
    try:
        await asyncio.wait_for(
            Supervisor(Endpoints("", ""), [other, late], grace_s=2).run(stop), 20
        )
        left = [p.pid for p in spawned if p.returncode is None]
        assert left == [], f"children still running after the supervisor stopped: {left}"
    finally:
        for proc in spawned:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


async def test_a_failed_spawn_does_not_end_a_childs_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart whose spawn fails once (EAGAIN, EMFILE, ENOMEM under pressure) is tried again
    after the next delay, instead of ending that child's watcher for good, unlogged."""
    monkeypatch.setattr(supervisor, "restart_delay_s", lambda _n: 0.01)
    real_exec = asyncio.create_subprocess_exec
    spawns: list[int] = []

    async def flaky(*argv: Any, **kw: Any) -> asyncio.subprocess.Process:
        spawns.append(1)
        if len(spawns) == 2:  # the first restart
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return await real_exec(*argv, **kw)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", flaky)
    child = Child("executor-0", [sys.executable, "-c", "pass"])  # exits at once
    stop = asyncio.Event()
    running = asyncio.create_task(Supervisor(Endpoints("", ""), [child], grace_s=1).run(stop))
    try:
        await until(lambda: _true(len(spawns) >= 4))
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)


async def _true(value: bool) -> bool:
    return value


async def test_sighup_is_a_clean_stop() -> None:
    """A closed terminal or a dropped SSH session sends SIGHUP to `up` and its roles: a stop
    like SIGTERM's (runs released), not the default death on the spot."""
    stop = asyncio.Event()
    supervisor.install_stop_signals(stop)
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(stop.wait(), timeout=5)
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def test_roles_do_not_import_from_the_working_folder(tmp_path: Path) -> None:
    """`python -m` puts the working folder first on the import path: a `queue.py` there would
    replace the standard library's in every role, which would exit and restart for ever."""
    (tmp_path / "queue.py").write_text("raise SystemExit('the folder queue.py was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(supervisor.__file__).parents[2])}
    for argv in (supervisor.role_argv("--help"), guarded(supervisor.role_argv("--help"))):
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, check=False)
        assert done.returncode == 0, (argv, done.stderr[-500:])
