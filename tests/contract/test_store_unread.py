"""The unread paths: `dispatch_many` with one source status, and `finish_many` whose runs name
their owner and carry no side effects, update without reading first. When every row is where
the batch expects it they send two statements per chunk (update, history); when one row has
moved on, that transaction rolls back and the locking path decides each row, so the results,
rows and history equal those of the locking path, on every dialect."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import event, text

from taskstream.core.errors import StoreError, StoreUnavailable
from taskstream.core.payloads import payload_problem
from taskstream.core.settings import MAX_PAYLOAD_LIMIT
from taskstream.core.states import Status
from taskstream.core.store.port import CasResult, ClaimRequest, DispatchRequest, FinishRequest
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.sql_engine import make_engine
from taskstream.core.store.sql_errors import translate_errors
from taskstream.core.store.urls import normalize_url
from tests.contract.conftest import Advance, MakeNew, trail
from tests.support.statements import statements


async def _pending(store: SqlStore, make_new: MakeNew, *names: str) -> list[str]:
    for name in names:
        await store.create_instance(make_new(name))
    return [f"inst-{n}" for n in names]


async def _running(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str, owner: str
) -> tuple[str, int]:
    [instance_id] = await _pending(store, make_new, name)
    await advance(instance_id, Status.DISPATCHED)
    claim = await store.claim(instance_id, expected_attempt=0, owner=owner, lease_s=30)
    assert claim is not None
    return instance_id, claim.token


async def test_dispatch_of_rows_where_the_outbox_left_them_reads_nothing(
    store: SqlStore, make_new: MakeNew
) -> None:
    ids = await _pending(store, make_new, "a", "b", "c")

    with statements(store) as sent:
        results = await store.dispatch_many([DispatchRequest(i, Status.PENDING, 0) for i in ids])

    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "INSERT"]
    assert results == dict.fromkeys(ids, CasResult(ok=True))
    for instance_id in ids:
        row = await store.get_instance(instance_id)
        assert row is not None and row.status is Status.DISPATCHED
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.to_status, last.reason, last.at_ms) == (
            Status.PENDING,
            Status.DISPATCHED,
            "published",
            row.updated_at_ms,
        )


async def test_dispatch_with_a_moved_row_rolls_back_and_decides_each_row(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    a, moved, c = await _pending(store, make_new, "a", "moved", "c")
    await advance(moved, Status.DISPATCHED)  # e.g. an executor saw its entry first
    before = await trail(store, moved)

    with statements(store) as sent:
        results = await store.dispatch_many(
            [DispatchRequest(i, Status.PENDING, 0) for i in (a, moved, c)]
        )

    # The unread UPDATE (rolled back), then lock and read, update, history.
    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "SELECT", "UPDATE", "INSERT"]
    assert results == {
        a: CasResult(ok=True),
        moved: CasResult(ok=False, found=Status.DISPATCHED),
        c: CasResult(ok=True),
    }
    assert await trail(store, moved) == before
    for instance_id in (a, c):
        assert [t[:2] for t in await trail(store, instance_id)] == [
            (None, Status.PENDING),
            (Status.PENDING, Status.DISPATCHED),
        ]


async def test_dispatch_of_rows_all_moved_on_reads_them_in_the_same_transaction(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """An executor that read the entries first claimed every row (the usual race of a batch
    of one): the UPDATE matched nothing, so nothing is rolled back, and the rows' statuses
    are read under their locks in that same transaction."""
    a, b = await _pending(store, make_new, "a", "b")
    for instance_id in (a, b):
        won = await store.claim_many([ClaimRequest(instance_id, 0, 30)], owner="x")
        assert won[instance_id].token == 1
    before = [await trail(store, i) for i in (a, b)]
    checkouts: list[object] = []

    def count(dbapi_connection: object, *rest: object) -> None:
        checkouts.append(dbapi_connection)

    requests = [DispatchRequest(i, Status.PENDING, 0) for i in (a, b)]
    # Pool listeners cannot be removed; this store is the test's own.
    event.listen(store.engine.sync_engine, "checkout", count)
    with statements(store) as sent:
        results = await store.dispatch_many(requests)

    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "SELECT"]
    assert len(checkouts) == 1  # one transaction
    assert results == dict.fromkeys((a, b), CasResult(ok=False, found=Status.RUNNING))
    assert [await trail(store, i) for i in (a, b)] == before


async def test_finish_naming_owners_reads_nothing_and_records_them(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    done, done_t = await _running(store, make_new, advance, "done", owner="exec-1")
    retry, retry_t = await _running(store, make_new, advance, "retry", owner="exec-2")
    requests = [
        FinishRequest(done, done_t, Status.SUCCESS, "ok", {"n": 1}, owner="exec-1"),
        FinishRequest(
            retry,
            retry_t,
            Status.RETRYING,
            "503",
            error="boom",
            next_attempt_at_ms=9,
            owner="exec-2",
        ),
    ]

    with statements(store) as sent:
        results = await store.finish_many(requests)

    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "INSERT"]
    assert results == {done: CasResult(ok=True), retry: CasResult(ok=True)}
    for instance_id, owner, status in (
        (done, "exec-1", Status.SUCCESS),
        (retry, "exec-2", Status.RETRYING),
    ):
        row = await store.get_instance(instance_id)
        assert row is not None and (row.status, row.lease_owner) == (status, None)
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.to_status, last.attempt, last.owner, last.at_ms) == (
            Status.RUNNING,
            status,
            1,
            owner,
            row.updated_at_ms,
        )
    retried = await store.get_instance(retry)
    assert retried is not None and (retried.last_error, retried.next_attempt_at_ms) == ("boom", 9)


async def test_finish_with_a_fenced_run_rolls_back_and_fences_only_it(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    done, done_t = await _running(store, make_new, advance, "done", owner="exec-1")
    stale, stale_t = await _running(store, make_new, advance, "stale", owner="exec-1")
    before = (await store.get_instance(stale), await trail(store, stale))
    requests = [
        FinishRequest(done, done_t, Status.SUCCESS, "ok", owner="exec-1"),
        FinishRequest(stale, stale_t + 1, Status.SUCCESS, "late", owner="exec-1"),
    ]

    with statements(store) as sent:
        results = await store.finish_many(requests)

    # The unread UPDATE (rolled back), then the locking path: lock, update, history.
    assert [s.lstrip().split()[0].upper() for s in sent] == ["UPDATE", "SELECT", "UPDATE", "INSERT"]
    assert results == {done: CasResult(ok=True), stale: CasResult(ok=False, found=Status.RUNNING)}
    assert (await store.get_instance(stale), await trail(store, stale)) == before
    assert [t[:2] for t in await trail(store, done)][-1] == (Status.RUNNING, Status.SUCCESS)
    assert len(await store.history(done)) == 4


async def test_finish_without_owners_or_with_side_effects_takes_the_locking_path(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    first, first_t = await _running(store, make_new, advance, "first", owner="exec-1")
    second, second_t = await _running(store, make_new, advance, "second", owner="exec-1")

    with statements(store) as no_owner:
        await store.finish_many([FinishRequest(first, first_t, Status.SUCCESS, "ok")])
    with statements(store) as keyed:
        await store.finish_many(
            [FinishRequest(second, second_t, Status.SUCCESS, "ok", side_effects=("k",), owner="x")]
        )

    assert no_owner[0].lstrip().upper().startswith("SELECT")
    assert keyed[0].lstrip().upper().startswith("SELECT")
    # Read under lock: the owner recorded is the row's, not the request's.
    assert (await store.history(second))[-1].owner == "exec-1"


async def test_batches_mixing_attempts_match_each_row_at_its_own(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    again, first_t = await _running(store, make_new, advance, "again", owner="exec-1")
    retry = FinishRequest(again, first_t, Status.RETRYING, "503", next_attempt_at_ms=0)
    assert (await store.finish_many([retry]))[again].ok
    assert (await store.dispatch_many([DispatchRequest(again, Status.RETRYING, 1)]))[again].ok
    [new] = await _pending(store, make_new, "new")
    await advance(new, Status.DISPATCHED)

    requests = [ClaimRequest(again, 1, 30), ClaimRequest(new, 0, 30)]
    won = await store.claim_many(requests, owner="x")
    results = await store.finish_many(
        [
            FinishRequest(again, won[again].token, Status.SUCCESS, "ok", owner="x"),
            FinishRequest(new, won[new].token, Status.SUCCESS, "ok", owner="x"),
        ]
    )

    assert (won[again].token, won[new].token) == (2, 1)
    assert results == {again: CasResult(ok=True), new: CasResult(ok=True)}
    for instance_id in (again, new):
        row = await store.get_instance(instance_id)
        assert row is not None and row.status is Status.SUCCESS
        assert (await store.history(instance_id))[-1].owner == "x"


async def test_a_batch_at_one_wrong_attempt_changes_nothing(
    store: SqlStore, make_new: MakeNew
) -> None:
    ids = await _pending(store, make_new, "a", "b")
    before = [await trail(store, i) for i in ids]

    results = await store.dispatch_many([DispatchRequest(i, Status.PENDING, 1) for i in ids])

    assert results == dict.fromkeys(ids, CasResult(ok=False, found=Status.PENDING))
    assert [await trail(store, i) for i in ids] == before


async def test_finishes_with_large_results_are_split_into_statements(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    # Two batches of 18 results of 1 MiB: 18 MiB each, more than MariaDB's default
    # max_allowed_packet (16 MiB) would let one statement carry.
    big = "r" * (1024 * 1024)
    runs = [await _running(store, make_new, advance, f"big{n:02d}", "w1") for n in range(36)]
    # Each result its own (equal results would be one literal in the UPDATE, not one each).
    named = [FinishRequest(i, t, Status.SUCCESS, "ok", {i: big}, owner="w1") for i, t in runs]
    unnamed = [FinishRequest(i, t, Status.SUCCESS, "ok", {i: big}) for i, t in runs]

    with statements(store, ("UPDATE",)) as sent:
        # The unread path for the first half, the locking path (no owner named) for the rest.
        results = await store.finish_many(named[:18]) | await store.finish_many(unnamed[18:])

    assert results == {i: CasResult(ok=True) for i, _ in runs}
    assert len(sent) > 2
    for instance_id, _ in runs:
        row = await store.get_instance(instance_id)
        assert row is not None and (row.status, row.result) == (Status.SUCCESS, {instance_id: big})


async def test_a_statement_over_the_packet_limit_is_refused_not_waited_out(
    store: SqlStore, db_url: str, make_new: MakeNew
) -> None:
    """MariaDB refuses a statement over its `max_allowed_packet` (error 1153) whatever the
    number of tries: a `StoreError` (callers split the batch or give up), not the
    `StoreUnavailable` that callers wait out and send again for ever."""
    if not db_url.startswith(("mysql", "mariadb")):
        pytest.skip("a MySQL / MariaDB limit")
    limit = await _packet_limit(store)
    huge = replace(make_new("huge"), payload={"p": "x" * (limit + 1024)})
    with pytest.raises(StoreError, match="packet limit") as caught:
        await store.create_instances([huge])
    assert not isinstance(caught.value, StoreUnavailable)
    await store.create_instances([make_new("next")])  # the store goes on
    assert await store.get_instance("inst-next") is not None
    assert await store.get_instance("inst-huge") is None


async def test_a_payload_at_the_largest_limit_fits_even_escaped(
    store: SqlStore, make_new: MakeNew
) -> None:
    """Backslashes are sent as two bytes each: a payload that `max_payload_bytes` at its
    largest lets through still fits MariaDB's default packet limit."""
    payload = {"p": "\\" * (MAX_PAYLOAD_LIMIT // 2 - 16)}
    assert payload_problem(payload, MAX_PAYLOAD_LIMIT) is None
    await store.create_instances([replace(make_new("wide"), payload=payload)])
    row = await store.get_instance("inst-wide")
    assert row is not None and row.payload == payload


async def _packet_limit(store: SqlStore) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())


async def test_a_server_that_stops_answering_makes_the_store_unavailable(db_url: str) -> None:
    """A reply that does not come within the read timeout (a frozen server, a link cut
    without a reset) ends the statement as `StoreUnavailable`, instead of a wait without end;
    `SLEEP` stands for the silence."""
    if not db_url.startswith(("mysql", "mariadb")):
        pytest.skip("a MySQL / MariaDB driver setting")
    engine = make_engine(normalize_url(db_url), read_timeout_s=0.3)
    try:
        with pytest.raises(StoreUnavailable, match="read timeout"):
            async with translate_errors("db"), engine.connect() as conn:
                await conn.execute(text("SELECT SLEEP(3)"))
    finally:
        await engine.dispose()
