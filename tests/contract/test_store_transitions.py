"""Compare-and-set status writes: winners write one history row, losers write nothing and
learn the status they found, and the state table is enforced before any SQL is sent."""

from __future__ import annotations

import itertools
from functools import partial

import pytest

from taskstream.core.errors import InvalidTransition
from taskstream.core.states import TRANSITIONS, FailClass, Status
from taskstream.core.store.port import CasResult, Store
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.urls import normalize_url
from tests.contract.conftest import Advance, MakeNew
from tests.support.races import dispatch_before_status_read

ALLOWED = sorted((src, dst) for src, targets in TRANSITIONS.items() for dst in targets)
FORBIDDEN = sorted(
    (src, dst) for src, dst in itertools.product(Status, Status) if dst not in TRANSITIONS[src]
)


def _fail_class(dst: Status) -> FailClass | None:
    return FailClass.EXHAUSTED if dst is Status.FAILED else None


async def test_cas_win_changes_status_and_appends_history(
    store: SqlStore, make_new: MakeNew
) -> None:
    await store.create_instance(make_new("a"))

    outcome = await store.transition(
        "inst-a", Status.PENDING, Status.DISPATCHED, reason="published", owner="scheduler-1"
    )

    assert outcome == CasResult(ok=True)
    row = await store.get_instance("inst-a")
    assert row is not None
    assert row.status is Status.DISPATCHED
    assert row.updated_at_ms >= row.created_at_ms
    last = (await store.history("inst-a"))[-1]
    assert (last.from_status, last.to_status) == (Status.PENDING, Status.DISPATCHED)
    assert (last.attempt, last.owner, last.reason) == (0, "scheduler-1", "published")
    assert last.at_ms == row.updated_at_ms


async def test_cas_lost_on_status_returns_found_and_writes_nothing(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    before = await store.history("inst-a")

    outcome = await store.transition("inst-a", Status.PENDING, Status.SKIPPED, reason="late")

    assert outcome == CasResult(ok=False, found=Status.DISPATCHED)
    assert await store.history("inst-a") == before
    row = await store.get_instance("inst-a")
    assert row is not None
    assert row.status is Status.DISPATCHED


async def test_cas_lost_on_attempt_returns_found_and_writes_nothing(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    before = await store.history("inst-a")

    outcome = await store.transition(
        "inst-a", Status.DISPATCHED, Status.TIMEOUT, reason="sweep", attempt=7
    )

    assert outcome == CasResult(ok=False, found=Status.DISPATCHED)
    assert await store.history("inst-a") == before


async def test_cas_lost_on_a_lease_extended_since_it_was_read(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """A recovery read the row (lease ending at `seen`); the heartbeat then extended the lease.
    The move conditioned on the lease it read loses; one on the lease as it is now wins."""
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    claim = await store.claim("inst-a", expected_attempt=0, owner="exec-1", lease_s=30)
    assert claim is not None
    seen = claim.lease_expires_at_ms
    assert await store.extend_lease("inst-a", token=claim.token, lease_s=90)
    now = await store.get_instance("inst-a")
    assert now is not None and now.lease_expires_at_ms is not None
    assert now.lease_expires_at_ms > seen
    before = await store.history("inst-a")
    timed_out = partial(
        store.transition, "inst-a", Status.RUNNING, Status.TIMEOUT, reason="lease_expired"
    )

    lost = await timed_out(attempt=claim.token, lease_until=seen)

    assert lost == CasResult(ok=False, found=Status.RUNNING)
    assert await store.history("inst-a") == before
    assert (await timed_out(attempt=claim.token, lease_until=now.lease_expires_at_ms)).ok


async def test_cas_on_missing_instance_finds_nothing(store: SqlStore) -> None:
    outcome = await store.transition("nope", Status.PENDING, Status.DISPATCHED, reason="x")

    assert outcome == CasResult(ok=False, found=None)
    assert await store.history("nope") == []


async def test_every_allowed_transition_writes_exactly_one_history_row(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    for src, dst in ALLOWED:
        name = f"{src.value}-{dst.value}".lower()
        await store.create_instance(make_new(name))
        await advance(f"inst-{name}", src)
        before = await store.history(f"inst-{name}")

        outcome = await store.transition(
            f"inst-{name}", src, dst, reason=f"to {dst}", fail_class=_fail_class(dst)
        )

        assert outcome.ok, (src, dst, outcome)
        after = await store.history(f"inst-{name}")
        assert after[: len(before)] == before
        assert [(h.from_status, h.to_status, h.reason) for h in after[len(before) :]] == [
            (src, dst, f"to {dst}")
        ]
        row = await store.get_instance(f"inst-{name}")
        assert row is not None
        assert row.status is dst
        assert row.fail_class is _fail_class(dst)


@pytest.fixture
def offline_store() -> SqlStore:
    """A store whose database does not exist: any SQL it sent would raise StoreUnavailable."""
    url = "mysql://root:secret@127.0.0.1:1/none"
    return SqlStore(make_engine(normalize_url(url)), display_url="mysql://root:***@127.0.0.1:1")


async def test_sql_store_satisfies_the_port(offline_store: SqlStore) -> None:
    port: Store = offline_store  # mypy --strict checks every method's signature here
    assert isinstance(port, SqlStore)
    await offline_store.close()


@pytest.mark.parametrize(("src", "dst"), FORBIDDEN, ids=str)
async def test_forbidden_transition_raises_before_any_sql(
    offline_store: SqlStore, src: Status, dst: Status
) -> None:
    with pytest.raises(InvalidTransition):
        await offline_store.transition("any", src, dst, reason="x", fail_class=_fail_class(dst))
    await offline_store.close()


async def test_fail_class_is_required_exactly_for_failed(offline_store: SqlStore) -> None:
    with pytest.raises(InvalidTransition):
        await offline_store.transition("any", Status.DISPATCHED, Status.FAILED, reason="x")
    with pytest.raises(InvalidTransition):
        await offline_store.transition(
            "any", Status.PENDING, Status.SKIPPED, reason="x", fail_class=FailClass.FATAL
        )
    with pytest.raises(InvalidTransition):
        await offline_store.finish("any", token=1, dst=Status.PENDING, reason="x")
    await offline_store.close()


async def _claimed(store: SqlStore, make_new: MakeNew, advance: Advance) -> int:
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    claim = await store.claim("inst-a", expected_attempt=0, owner="exec-1", lease_s=30)
    assert claim is not None
    return claim.token


async def test_leaving_running_clears_the_lease_and_keeps_the_attempt(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    token = await _claimed(store, make_new, advance)

    await store.transition(
        "inst-a", Status.RUNNING, Status.TIMEOUT, reason="lease expired", owner="sweeper"
    )

    row = await store.get_instance("inst-a")
    assert row is not None
    assert (row.status, row.attempt, row.lease_owner, row.lease_expires_at_ms) == (
        Status.TIMEOUT,
        token,
        None,
        None,
    )


async def test_retry_fail_and_requeue_set_and_clear_their_fields(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    token = await _claimed(store, make_new, advance)
    await store.transition("inst-a", Status.RUNNING, Status.TIMEOUT, reason="lease expired")

    await store.transition(
        "inst-a",
        Status.TIMEOUT,
        Status.RETRYING,
        reason="backoff",
        attempt=token,
        error="boom",
        next_attempt_at_ms=1_800_000_000_000,
    )
    retrying = await store.get_instance("inst-a")
    fail_class = FailClass.EXHAUSTED
    await store.transition(
        "inst-a", Status.RETRYING, Status.FAILED, reason="x", fail_class=fail_class
    )
    await store.transition("inst-a", Status.FAILED, Status.PENDING, reason="fixed", owner="alice")
    requeued = await store.get_instance("inst-a")

    assert retrying is not None
    assert (retrying.next_attempt_at_ms, retrying.last_error) == (1_800_000_000_000, "boom")
    assert requeued is not None
    assert (requeued.status, requeued.fail_class, requeued.next_attempt_at_ms) == (
        Status.PENDING,
        None,
        None,
    )
    # A requeue starts a new attempt: entries of the failed ones are older attempts now.
    assert (requeued.attempt, requeued.last_error) == (token + 1, "boom")
    last = (await store.history("inst-a"))[-1]
    assert (last.owner, last.reason, last.attempt) == ("alice", "fixed", token + 1)


async def test_long_reason_is_cut_to_the_column(store: SqlStore, make_new: MakeNew) -> None:
    await store.create_instance(make_new("a"))

    await store.transition("inst-a", Status.PENDING, Status.SKIPPED, reason="é" * 900)

    assert (await store.history("inst-a"))[-1].reason == "é" * 500


async def test_a_cas_whose_row_reaches_its_source_after_the_miss_is_tried_again(
    store: SqlStore, db_url: str, make_new: MakeNew, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READ COMMITTED: the UPDATE misses the row (PENDING), another writer's commit brings it
    to the CAS's source (DISPATCHED) before the status is read. The store tries the UPDATE
    once more and wins, rather than reporting a loss to its own source status."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite runs one writer at a time: no commit lands between the two")
    await store.create_instance(make_new("a"))
    async with dispatch_before_status_read(monkeypatch, db_url) as raced:
        outcome = await store.transition(
            "inst-a",
            Status.DISPATCHED,
            Status.FAILED,
            reason="unknown_agent",
            fail_class=FailClass.POISON,
        )
    assert raced == [Status.DISPATCHED]
    assert outcome == CasResult(ok=True)
    steps = [(h.from_status, h.to_status) for h in await store.history("inst-a")]
    assert steps[-2:] == [(Status.PENDING, Status.DISPATCHED), (Status.DISPATCHED, Status.FAILED)]


async def test_a_cas_at_another_attempt_still_reports_its_source_status(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """Only a different attempt leaves `found` at the CAS's own source status."""
    await store.create_instance(make_new("a"))
    await advance("inst-a", Status.DISPATCHED)
    outcome = await store.transition(
        "inst-a", Status.DISPATCHED, Status.TIMEOUT, reason="late", attempt=7
    )
    assert outcome == CasResult(ok=False, found=Status.DISPATCHED)
