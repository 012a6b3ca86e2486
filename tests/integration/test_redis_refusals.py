"""A Redis that answers but refuses our writes for a while (READONLY from a replica after a
failover, MASTERDOWN, OOM) pauses the roles like a Redis that is down; it does not end them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import MasterDownError, OutOfMemoryError, ReadOnlyError

from taskstream.core import streams
from taskstream.core import streams_admin as admin
from taskstream.core.states import Status
from tests.integration.harness import Harness, Running, until
from tests.integration.outages import TASKS

REFUSALS = [
    ReadOnlyError("You can't write against a read only replica."),
    MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda e: type(e).__name__)
async def test_a_refused_read_pauses_the_executor_which_then_runs_the_work(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, refusal: Exception
) -> None:
    h = outage
    read = streams.read
    calls: list[int] = []

    async def refusing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise refusal
        return await read(*args, **kwargs)

    monkeypatch.setattr(streams, "read", refusing)
    row = await h.trigger(TASKS, "quick")
    running = Running(h.executor())
    try:

        async def done() -> bool:
            found = await h.store.get_instance(row.id)
            return found is not None and found.status is Status.SUCCESS

        await until(done)
        assert not running.task.done()
    finally:
        await running.close()


async def test_a_refused_pass_pauses_the_sweeper_which_then_sweeps_again(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = outage
    pending = admin.pending
    calls: list[int] = []

    async def refusing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ReadOnlyError("You can't write against a read only replica.")
        return await pending(*args, **kwargs)

    monkeypatch.setattr(admin, "pending", refusing)
    stop = asyncio.Event()
    sweeping = asyncio.create_task(h.sweeper(interval_s=0.05).run(stop))
    try:

        async def swept_again() -> bool:
            return len(calls) > 3

        await until(swept_again)
        assert not sweeping.done()
    finally:
        stop.set()
        await asyncio.wait_for(sweeping, timeout=20)
