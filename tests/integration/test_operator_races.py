"""Operator commands against a store that fails part-way, and against each other: what was
done stands and is said, and no run is made twice."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from taskstream.core import operations
from taskstream.core import streams_admin as admin
from taskstream.core.errors import StoreUnavailable
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.harness import Harness
from tests.integration.test_operations import TASKS, h

__all__ = ["h"]  # the fixture, shared with test_operations


def _down_after_transition(store: SqlStore, monkeypatch: pytest.MonkeyPatch, *failing: str) -> None:
    """Once a status move commits, the store's `failing` methods raise `StoreUnavailable`,
    as a database that goes away right after a commit."""
    real: Callable[..., Awaitable[Any]] = store.transition

    async def down(*_: object, **__: object) -> Any:
        raise StoreUnavailable("store sqlite://... unavailable: OperationalError")

    async def then_down(*args: Any, **kwargs: Any) -> Any:
        moved = await real(*args, **kwargs)
        for name in failing:
            monkeypatch.setattr(store, name, down)
        return moved

    monkeypatch.setattr(store, "transition", then_down)


async def _failed(h: Harness) -> str:
    row = await h.trigger(TASKS, "once-fails")
    await h.run_until(row.id, Status.FAILED)
    return row.id


@pytest.mark.parametrize("failing", [("get_instance", "dispatch_many"), ("dispatch_many",)])
async def test_a_retry_whose_store_fails_after_the_requeue_says_the_requeue_stands(
    h: Harness, monkeypatch: pytest.MonkeyPatch, failing: tuple[str, ...]
) -> None:
    """FAILED -> PENDING committed, then the store went away: the requeue is done, so the
    command must not report a failure (a script would retry and be told the instance is not
    FAILED); it says what is left, and the reconciler or the executor finishes it."""
    instance_id = await _failed(h)
    _down_after_transition(h.store, monkeypatch, *failing)
    late = await operations.requeue(
        h.outbox, instance_id, who="ops", why="fixed", now_ms=h.clock.now_ms()
    )
    monkeypatch.undo()
    assert late is not None, late
    after = await h.store.get_instance(instance_id)
    assert after is not None and after.status is Status.PENDING
    history = await h.store.history(instance_id)
    assert [(x.owner, x.note) for x in history if x.reason == "requeued"] == [("ops", "fixed")]
    if "get_instance" in failing:
        assert late.startswith("not published yet (store sqlite://... unavailable"), late
        assert late.endswith("the reconciler publishes it"), late
        h.clock.advance(60_000)
        assert await h.reconciler().reconcile() == 1
    else:
        assert late.startswith("published; its move to DISPATCHED not recorded (store "), late
    assert instance_id in await admin.instance_ids(h.redis, h.keys)
    await h.run_until(instance_id, Status.SUCCESS)
