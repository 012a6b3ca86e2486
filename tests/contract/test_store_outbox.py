"""The outbox's batch writes: `create_instances` equals sequential `create_instance` calls
(rows, history, duplicate answers), and `dispatch_many` is a CAS per row to DISPATCHED with a
history row per win, on every dialect."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from taskstream.core.errors import InvalidTransition
from taskstream.core.states import Status
from taskstream.core.store import sql_templates as templates
from taskstream.core.store.port import (
    CasResult,
    CreateResult,
    DefinitionRecord,
    DispatchRequest,
    NewInstance,
)
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import Advance, MakeNew, trail
from tests.support.statements import calls, statements


def _strip(row: object) -> object:
    """A row without its times, which differ between two runs."""
    return dataclasses.replace(row, created_at_ms=0, updated_at_ms=0)  # type: ignore[type-var]


async def test_create_instances_equals_sequential_creates(
    store: SqlStore, make_new: MakeNew
) -> None:
    await store.create_instance(make_new("b-taken"))
    await store.create_instance(make_new("s-taken"))
    names = ["one", "taken", "two", "one-again", "three"]

    def batch_of(prefix: str) -> list[NewInstance]:
        news = [make_new(f"{prefix}-{n}") for n in names]
        # Same dedupe key as an earlier request of the batch, other id: a duplicate of it.
        news[3] = dataclasses.replace(news[3], dedupe_key=news[0].dedupe_key)
        return [*news, dataclasses.replace(make_new(f"{prefix}-four"), reason="backfill")]

    results = await store.create_instances(batch_of("b"))
    expected = [await store.create_instance(n) for n in batch_of("s")]

    def short(rs: list[CreateResult], prefix: str) -> list[tuple[bool, str]]:
        return [(r.created, r.instance_id.replace(f"-{prefix}-", "-")) for r in rs]

    assert short(results, "b") == short(expected, "s")
    assert [r.created for r in results] == [True, False, True, False, True, True]
    for b, s in zip(batch_of("b"), batch_of("s"), strict=True):
        got, want = await store.get_instance(b.id), await store.get_instance(s.id)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            named = {k: getattr(got, k) for k in ("id", "dedupe_key", "payload", "trace_id")}
            assert _strip(got) == dataclasses.replace(_strip(want), **named)  # type: ignore[type-var]
            assert await trail(store, got.id) == await trail(store, want.id)
    [created] = await store.history("inst-b-four")
    assert (created.from_status, created.to_status, created.reason) == (
        None,
        Status.PENDING,
        "backfill",
    )


async def test_a_batch_inserts_its_rows_with_one_statement_built_once(
    store: SqlStore, make_new: MakeNew
) -> None:
    await store.create_instances([make_new("warm-up-1"), make_new("warm-up-2")])
    built = templates.insert_row.cache_info().misses

    with (
        statements(store, ("INSERT INTO TASK_INSTANCES",)) as sent,
        calls(store, "INSERT INTO TASK_INSTANCES") as through_engine,
    ):
        results = await store.create_instances([make_new(f"m{n:02d}") for n in range(40)])

    assert all(r.created for r in results)
    # One statement for the 40 rows, from the one-row INSERT every batch size shares: on
    # the driver path repeated as text, through the engine an executemany whose compiled
    # form comes from its cache (rendered as one multi-row INSERT, "insertmanyvalues").
    assert len(sent) == 1
    assert templates.insert_row.cache_info().misses == built
    assert all(c.cached for c in through_engine)
    if store.engine.dialect.name == "mysql":
        assert sent[0].count("UNIX_TIMESTAMP") == 2 * 40


async def test_a_batch_larger_than_a_statement_may_be_is_split(
    store: SqlStore, make_new: MakeNew
) -> None:
    # 24 rows of 1 MiB payloads: 24 MiB, more than MariaDB's default max_allowed_packet.
    big = "x" * (1024 * 1024)
    news = [dataclasses.replace(make_new(f"big{n:02d}"), payload={"blob": big}) for n in range(24)]

    with statements(store, ("INSERT INTO TASK_INSTANCES",)) as sent:
        results = await store.create_instances(news)

    assert all(r.created for r in results)
    assert len(sent) > 1
    for new in news:
        row = await store.get_instance(new.id)
        assert row is not None and row.payload == {"blob": big}
        assert await trail(store, new.id) == [(None, Status.PENDING, 0, None, "scheduled")]


async def test_create_instances_of_nothing_writes_nothing(store: SqlStore) -> None:
    assert await store.create_instances([]) == []


async def test_concurrent_batches_create_each_key_once(store: SqlStore, make_new: MakeNew) -> None:
    news = [make_new(f"c{n:02d}") for n in range(40)]
    runs = await asyncio.gather(
        store.create_instances(news[:30]),
        store.create_instances(news[10:]),
        store.create_instances(list(reversed(news))),
    )
    for results in runs:
        assert all(r.instance_id.startswith("inst-c") for r in results)
    created = [r.instance_id for results in runs for r in results if r.created]
    assert sorted(created) == sorted(n.id for n in news)
    for new in news:
        assert [h.to_status for h in await store.history(new.id)] == [Status.PENDING]


async def test_dispatch_many_moves_only_rows_at_their_state(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    for name in ("p", "r", "late", "gone-on"):
        await store.create_instance(make_new(name))
    await advance("inst-r", Status.RETRYING)
    await advance("inst-gone-on", Status.DISPATCHED)
    requests = [
        DispatchRequest("inst-p", Status.PENDING, 0),
        DispatchRequest("inst-r", Status.RETRYING, 0),
        DispatchRequest("inst-late", Status.PENDING, 1),  # wrong attempt
        DispatchRequest("inst-gone-on", Status.PENDING, 0),  # moved on meanwhile
        DispatchRequest("inst-missing", Status.PENDING, 0),
    ]
    results = await store.dispatch_many(requests)

    assert list(results) == [r.instance_id for r in requests]
    assert results == {
        "inst-p": CasResult(ok=True),
        "inst-r": CasResult(ok=True),
        "inst-late": CasResult(ok=False, found=Status.PENDING),
        "inst-gone-on": CasResult(ok=False, found=Status.DISPATCHED),
        "inst-missing": CasResult(ok=False, found=None),
    }
    for instance_id, src in (("inst-p", Status.PENDING), ("inst-r", Status.RETRYING)):
        row = await store.get_instance(instance_id)
        assert row is not None and row.status is Status.DISPATCHED
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.to_status, last.reason) == (
            src,
            Status.DISPATCHED,
            "published",
        )
        assert last.at_ms == row.updated_at_ms
    late = await store.get_instance("inst-late")
    assert late is not None and late.status is Status.PENDING
    assert len(await store.history("inst-gone-on")) == 2


async def test_dispatch_many_reads_first_while_rows_keep_moving_on_before_it(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """After a batch that found a row moved on (an executor claimed it first), the next one
    locks and reads before it updates instead of trying an update that would fail; once a
    batch finds every row where it expected it, updates go first again. Same results."""
    for name in ("a", "b", "c", "d", "e", "f"):
        await store.create_instance(make_new(name))
    await advance("inst-b", Status.DISPATCHED)

    async def dispatch(*names: str) -> tuple[dict[str, CasResult], str]:
        with statements(store) as sent:
            got = await store.dispatch_many(
                [DispatchRequest(f"inst-{n}", Status.PENDING, 0) for n in names]
            )
        return got, sent[0].lstrip().split()[0].upper()

    moved, first = await dispatch("a", "b")
    assert (moved["inst-b"], first) == (CasResult(ok=False, found=Status.DISPATCHED), "UPDATE")
    fine, first = await dispatch("c", "d")
    assert (set(fine.values()), first) == ({CasResult(ok=True)}, "SELECT")
    fine, first = await dispatch("e", "f")
    assert (set(fine.values()), first) == ({CasResult(ok=True)}, "UPDATE")


async def test_dispatch_many_rejects_bad_requests_before_any_sql(
    store: SqlStore, make_new: MakeNew
) -> None:
    await store.create_instance(make_new("x"))
    with pytest.raises(InvalidTransition):
        await store.dispatch_many([DispatchRequest("inst-x", Status.RUNNING, 0)])
    with pytest.raises(ValueError, match="named twice"):
        await store.dispatch_many(
            [
                DispatchRequest("inst-x", Status.PENDING, 0),
                DispatchRequest("inst-x", Status.PENDING, 0),
            ]
        )
    row = await store.get_instance("inst-x")
    assert row is not None and row.status is Status.PENDING


async def test_instances_of_a_stale_leader_are_fenced(store: SqlStore, make_new: MakeNew) -> None:
    await store.upsert_definitions([DefinitionRecord("report", {"id": "report"}, "h")])
    await store.claim_cursors(5)
    other = dataclasses.replace(make_new("undefined"), task_id="undefined")
    news = [make_new("stale"), make_new("current"), make_new("manual"), other]

    results = await store.create_instances(news, tokens=[4, 5, None, 4])

    assert [(r.created, r.fenced, r.instance_id) for r in results] == [
        (False, True, "inst-stale"),
        (True, False, "inst-current"),
        (True, False, "inst-manual"),
        (True, False, "inst-undefined"),  # no definition holds a token to fence it with
    ]
    assert await store.get_instance("inst-stale") is None
    assert await store.history("inst-stale") == []
    one = await store.create_instance(make_new("one"), token=4)
    assert (one.created, one.fenced, await store.get_instance("inst-one")) == (False, True, None)
    assert (await store.create_instance(make_new("newer"), token=6)).created


async def test_create_instances_wants_one_token_per_instance(
    store: SqlStore, make_new: MakeNew
) -> None:
    with pytest.raises(ValueError, match="one token"):
        await store.create_instances([make_new("a"), make_new("b")], tokens=[1])
