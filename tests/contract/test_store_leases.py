"""Claims, leases and fencing: the attempt is the fencing token, leases come from the
database clock, and a commit with a stale token or a reused side effect key changes nothing."""

from __future__ import annotations

import pytest

from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import Advance, MakeNew


async def _dispatched(store: SqlStore, make_new: MakeNew, advance: Advance, name: str) -> str:
    await store.create_instance(make_new(name))
    await advance(f"inst-{name}", Status.DISPATCHED)
    return f"inst-{name}"


async def test_claim_bumps_attempt_and_leases_from_the_database_clock(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")

    before = await store.db_now_ms()
    claim = await store.claim(instance_id, expected_attempt=0, owner="exec-1", lease_s=42.5)
    after = await store.db_now_ms()

    assert claim is not None
    assert claim.token == 1
    assert before + 42_500 <= claim.lease_expires_at_ms <= after + 42_500
    row = await store.get_instance(instance_id)
    assert row is not None
    assert (row.status, row.attempt, row.lease_owner) == (Status.RUNNING, 1, "exec-1")
    assert row.lease_expires_at_ms == claim.lease_expires_at_ms
    last = (await store.history(instance_id))[-1]
    assert (last.from_status, last.to_status, last.attempt, last.owner) == (
        Status.DISPATCHED,
        Status.RUNNING,
        1,
        "exec-1",
    )


async def test_claim_loses_on_wrong_attempt_or_status(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")
    history = await store.history(instance_id)

    assert await store.claim(instance_id, expected_attempt=3, owner="x", lease_s=10) is None
    assert await store.history(instance_id) == history

    assert await store.claim(instance_id, expected_attempt=0, owner="x", lease_s=10) is not None
    assert await store.claim(instance_id, expected_attempt=0, owner="y", lease_s=10) is None
    assert await store.claim("missing", expected_attempt=0, owner="y", lease_s=10) is None
    row = await store.get_instance(instance_id)
    assert row is not None
    assert (row.attempt, row.lease_owner) == (1, "x")


async def test_extend_lease_needs_the_current_token(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")
    claim = await store.claim(instance_id, expected_attempt=0, owner="x", lease_s=1)
    assert claim is not None

    before = await store.db_now_ms()
    assert await store.extend_lease(instance_id, token=claim.token, lease_s=600)
    assert not await store.extend_lease(instance_id, token=claim.token + 1, lease_s=600)
    assert not await store.extend_lease("missing", token=1, lease_s=600)

    row = await store.get_instance(instance_id)
    assert row is not None
    assert row.lease_expires_at_ms is not None
    assert row.lease_expires_at_ms >= before + 600_000


async def test_non_positive_lease_is_rejected(store: SqlStore) -> None:
    with pytest.raises(ValueError, match="lease_s"):
        await store.claim("any", expected_attempt=0, owner="x", lease_s=0)
    with pytest.raises(ValueError, match="lease_s"):
        await store.extend_lease("any", token=1, lease_s=-1)


async def test_finish_commits_outcome_clears_lease_and_records_side_effects(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")
    claim = await store.claim(instance_id, expected_attempt=0, owner="exec-1", lease_s=30)
    assert claim is not None

    outcome = await store.finish(
        instance_id,
        token=claim.token,
        dst=Status.SUCCESS,
        reason="done",
        result={"summary": "ok", "n": 3},
        side_effects=["mail:1", "mail:1", "hook:2"],
    )

    assert outcome == CasResult(ok=True)
    row = await store.get_instance(instance_id)
    assert row is not None
    assert (row.status, row.result, row.lease_owner, row.lease_expires_at_ms) == (
        Status.SUCCESS,
        {"summary": "ok", "n": 3},
        None,
        None,
    )
    last = (await store.history(instance_id))[-1]
    assert (last.from_status, last.to_status, last.attempt, last.owner, last.reason) == (
        Status.RUNNING,
        Status.SUCCESS,
        1,
        "exec-1",
        "done",
    )


async def test_finish_with_stale_token_is_fenced(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")
    zombie = await store.claim(instance_id, expected_attempt=0, owner="zombie", lease_s=1)
    assert zombie is not None
    for src, dst in [
        (Status.RUNNING, Status.TIMEOUT),
        (Status.TIMEOUT, Status.RETRYING),
        (Status.RETRYING, Status.DISPATCHED),
    ]:
        assert (await store.transition(instance_id, src, dst, reason="sweep")).ok
    live = await store.claim(instance_id, expected_attempt=zombie.token, owner="live", lease_s=30)
    assert live is not None
    assert live.token == zombie.token + 1
    history = await store.history(instance_id)
    row = await store.get_instance(instance_id)

    fenced = await store.finish(
        instance_id, token=zombie.token, dst=Status.SUCCESS, reason="late", side_effects=["k"]
    )

    assert fenced == CasResult(ok=False, found=Status.RUNNING)
    assert await store.history(instance_id) == history
    assert await store.get_instance(instance_id) == row
    done = await store.finish(
        instance_id, token=live.token, dst=Status.SUCCESS, reason="ok", side_effects=["k"]
    )
    assert done.ok, "the fenced attempt must not have recorded its side effect key"


async def test_reused_side_effect_key_rolls_the_whole_finish_back(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    first = await _dispatched(store, make_new, advance, "a")
    second = await _dispatched(store, make_new, advance, "b")
    one = await store.claim(first, expected_attempt=0, owner="x", lease_s=30)
    two = await store.claim(second, expected_attempt=0, owner="y", lease_s=30)
    assert one is not None
    assert two is not None
    ok = await store.finish(
        first, token=one.token, dst=Status.SUCCESS, reason="ok", side_effects=["notify:2024-01-01"]
    )
    assert ok.ok
    history = await store.history(second)

    clash = await store.finish(
        second,
        token=two.token,
        dst=Status.FAILED,
        reason="dup",
        fail_class=FailClass.FATAL,
        error="boom",
        side_effects=["fresh-key", "notify:2024-01-01"],
    )

    assert clash == CasResult(ok=False, found=Status.RUNNING)
    assert await store.history(second) == history
    row = await store.get_instance(second)
    assert row is not None
    assert (row.status, row.fail_class, row.last_error, row.lease_owner) == (
        Status.RUNNING,
        None,
        None,
        "y",
    )
    # "fresh-key" was rolled back with the rest, so it is still free.
    retry = await store.finish(
        second, token=two.token, dst=Status.SUCCESS, reason="ok", side_effects=["fresh-key"]
    )
    assert retry.ok


async def test_finish_to_retrying_sets_the_due_time_and_error(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    instance_id = await _dispatched(store, make_new, advance, "a")
    claim = await store.claim(instance_id, expected_attempt=0, owner="x", lease_s=30)
    assert claim is not None

    outcome = await store.finish(
        instance_id,
        token=claim.token,
        dst=Status.RETRYING,
        reason="upstream 503",
        error="x" * 20_000,
        next_attempt_at_ms=1_900_000_000_000,
    )

    assert outcome.ok
    row = await store.get_instance(instance_id)
    assert row is not None
    assert row.next_attempt_at_ms == 1_900_000_000_000
    assert row.last_error == "x" * 10_000
    assert row.result is None
