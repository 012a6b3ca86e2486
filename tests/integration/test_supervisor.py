"""The supervisor of `taskstream up`, with real child processes."""

from __future__ import annotations

import asyncio
import sys

from taskstream.runtime.endpoint import Endpoints
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
