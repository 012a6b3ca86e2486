"""Readiness markers and active instances, on every dialect."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from taskstream.core.errors import ClaimLost
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import MakeNew


async def test_markers_are_set_once_per_business_date(store: SqlStore) -> None:
    assert await store.mark_ready("raw.ready", "2026-11-30")
    assert not await store.mark_ready("raw.ready", "2026-11-30")
    assert await store.mark_ready("raw.ready", "2026-12-01")
    found = await store.ready_markers(["raw.ready", "other.ready"], "2026-11-30")
    assert found == {"raw.ready"}
    assert await store.ready_markers([], "2026-11-30") == set()


async def test_a_marker_set_for_a_claim_is_set_only_while_the_claim_is_held(
    store: SqlStore, make_new: MakeNew
) -> None:
    """A run's marker is fenced like its commit: set while its instance is RUNNING at the
    run's token, refused (nothing set) once the instance moved on to a newer attempt."""
    await store.create_instance(make_new("a"))
    await store.transition("inst-a", Status.PENDING, Status.DISPATCHED, reason="t")
    assert (await store.claim_many([ClaimRequest("inst-a", 0, 60)], owner="x"))["inst-a"].token == 1
    assert await store.mark_ready("first.ready", "2026-11-30", claim=("inst-a", 1))
    assert not await store.mark_ready("first.ready", "2026-11-30", claim=("inst-a", 1))

    moved = await store.transition(
        "inst-a", Status.RUNNING, Status.TIMEOUT, reason="lease_expired", attempt=1
    )
    assert moved.ok
    with pytest.raises(ClaimLost, match="inst-a: claim 1 no longer held"):
        await store.mark_ready("late.ready", "2026-11-30", claim=("inst-a", 1))
    with pytest.raises(ClaimLost, match="no row"):
        await store.mark_ready("late.ready", "2026-11-30", claim=("inst-zz", 1))
    assert await store.ready_markers(["first.ready", "late.ready"], "2026-11-30") == {"first.ready"}


async def test_active_instances_exclude_settled_ones(store: SqlStore, make_new: MakeNew) -> None:
    for name in ("a", "b", "c"):
        await store.create_instance(make_new(name))
    await store.transition("inst-b", Status.PENDING, Status.SKIPPED, reason="t")
    await store.transition("inst-c", Status.PENDING, Status.DISPATCHED, reason="t")
    await store.transition(
        "inst-c", Status.DISPATCHED, Status.FAILED, reason="t", fail_class=FailClass.FATAL
    )
    active = await store.active_instances("report")
    assert [r.id for r in active] == ["inst-a"]
    assert await store.active_instances("nothing") == []


async def test_active_instances_come_oldest_or_newest_first(
    store: SqlStore, make_new: MakeNew
) -> None:
    for n, name in enumerate(("b", "c", "a", "d")):
        fire_ms = 1_700_000_000_000 + (n % 3) * 60_000  # b and d share the oldest fire time
        await store.create_instance(dataclasses.replace(make_new(name), scheduled_for_ms=fire_ms))
    oldest = await store.active_instances("report", limit=3)
    assert [r.id for r in oldest] == ["inst-b", "inst-d", "inst-c"]
    newest = await store.active_instances("report", limit=3, newest_first=True)
    assert [r.id for r in newest] == ["inst-a", "inst-c", "inst-d"]


async def test_upstream_limits_are_stored_by_name(store: SqlStore) -> None:
    llm = {"limit": 50, "window": 10.0, "burst": None}
    assert await store.upsert_upstreams({"llm": llm}) == {"llm": "created"}
    assert await store.upsert_upstreams({"llm": llm}) == {"llm": "unchanged"}
    assert await store.upsert_upstreams({"llm": {**llm, "limit": 60}, "web": llm}) == {
        "llm": "updated",
        "web": "created",
    }
    assert await store.list_upstreams() == {"llm": {**llm, "limit": 60}, "web": llm}


async def test_concurrent_applies_of_one_new_upstream_all_succeed(
    store: SqlStore, db_url: str
) -> None:
    """Several `tasks apply` at once declare the same new upstream: one creates it and the
    others find it, instead of failing on the duplicate name after their definitions were
    written."""
    others = [await SqlStore.connect(db_url) for _ in range(6)]
    try:
        for round_ in range(4):
            config = {f"api{round_}": {"limit": 5, "window": 60.0, "burst": None}}
            done = await asyncio.gather(*(s.upsert_upstreams(config) for s in [store, *others]))
            assert sorted(d[f"api{round_}"] for d in done) == ["created"] + ["unchanged"] * 6
    finally:
        for other in others:
            await other.close()


async def test_existing_instances_are_found_among_many_ids(
    store: SqlStore, make_new: MakeNew
) -> None:
    """Settled or not; more ids than one `IN` list holds."""
    for name in ("a", "b"):
        await store.create_instance(make_new(name))
    await store.transition("inst-b", Status.PENDING, Status.SKIPPED, reason="t")
    asked = [f"inst-x{i}" for i in range(1200)] + ["inst-b", "inst-a"]
    assert await store.existing_instances(asked) == {"inst-a", "inst-b"}
    assert await store.existing_instances([]) == set()
