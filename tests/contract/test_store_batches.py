"""Batches: `claim_many`, `finish_many` and `extend_leases` keep the single-row rules (CAS on
(id, status, attempt), one history row per win, fenced runs change nothing), win each row at
most once under concurrency, equal sequential `finish` calls, and send a number of statements
that does not grow with the batch."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterable
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from taskstream.core.errors import InvalidTransition
from taskstream.core.states import FailClass, Status
from taskstream.core.store import sql_queries
from taskstream.core.store.port import CasResult, ClaimRequest, FinishRequest, InstanceRow
from taskstream.core.store.records import stored_json
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import (
    instance_history,
    review_queue,
    side_effects,
    task_instances,
)
from tests.contract.conftest import Advance, MakeNew
from tests.support.statements import statements

T0_MS = 1_700_000_000_000


async def _seed(
    store: SqlStore,
    names: Iterable[str],
    *,
    status: Status = Status.DISPATCHED,
    attempt: int = 0,
    owner: str | None = None,
) -> list[str]:
    """Insert instances directly in one state (no history): fast setup for many rows."""
    values = [
        {
            "id": f"inst-{n}",
            "task_id": "report",
            "agent": "echo",
            "dedupe_key": f"report:{n}",
            "status": status.value,
            "attempt": attempt,
            "max_attempts": 3,
            "priority": "default",
            "scheduled_for_ms": T0_MS,
            "payload": "{}",
            "context": "{}",
            "trace_id": "",
            "lease_owner": owner,
            "lease_expires_at_ms": None if owner is None else T0_MS,
            "created_at_ms": T0_MS,
            "updated_at_ms": T0_MS,
        }
        for n in names
    ]
    async with store.engine.begin() as conn:
        await conn.execute(insert(task_instances), values)
    return [str(v["id"]) for v in values]


async def _dispatched(store: SqlStore, make_new: MakeNew, advance: Advance, name: str) -> str:
    await store.create_instance(make_new(name))
    await advance(f"inst-{name}", Status.DISPATCHED)
    return f"inst-{name}"


async def _running(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str, owner: str = "exec-1"
) -> tuple[str, int]:
    instance_id = await _dispatched(store, make_new, advance, name)
    claim = await store.claim(instance_id, expected_attempt=0, owner=owner, lease_s=30)
    assert claim is not None
    return instance_id, claim.token


async def _record_key(store: SqlStore, key: str) -> None:
    """Record `key` as committed by another run."""
    async with store.engine.begin() as conn:
        row = {"idempotency_key": key, "instance_id": "other", "attempt": 1, "created_at_ms": 0}
        await conn.execute(insert(side_effects).values(row))


async def _count(store: SqlStore, table: Any, *where: Any) -> int:
    async with store.engine.connect() as conn:
        stmt = select(func.count()).select_from(table).where(*where)
        return int((await conn.execute(stmt)).scalar_one())


# claim_many


async def test_claim_many_wins_exactly_the_matching_rows(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    a = await _dispatched(store, make_new, advance, "a")
    b = await _dispatched(store, make_new, advance, "b")
    stale = await _dispatched(store, make_new, advance, "stale")
    await store.create_instance(make_new("pending"))
    # Already claimed by this same owner: attempt is expected + 1, yet this batch did not win it.
    again, _ = await _running(store, make_new, advance, "again", owner="exec-1")
    untouched = {i: await store.get_instance(i) for i in (stale, "inst-pending", again)}
    requests = [
        ClaimRequest(a, 0, 30),
        ClaimRequest(b, 0, 60.5),
        ClaimRequest(stale, 5, 30),
        ClaimRequest("inst-pending", 0, 30),
        ClaimRequest("inst-missing", 0, 30),
        ClaimRequest(again, 0, 30),
    ]

    before = await store.db_now_ms()
    claimed = await store.claim_many(requests, owner="exec-1")
    after = await store.db_now_ms()

    assert set(claimed) == {a, b}
    for instance_id, lease_ms in ((a, 30_000), (b, 60_500)):
        won = claimed[instance_id]
        assert won.row == await store.get_instance(instance_id)
        assert (won.token, won.row.status, won.row.attempt, won.row.lease_owner) == (
            1,
            Status.RUNNING,
            1,
            "exec-1",
        )
        assert won.lease_expires_at_ms == won.row.lease_expires_at_ms
        assert before + lease_ms <= won.lease_expires_at_ms <= after + lease_ms
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.to_status, last.attempt, last.owner, last.reason) == (
            Status.DISPATCHED,
            Status.RUNNING,
            1,
            "exec-1",
            "claimed",
        )
        assert last.at_ms == won.row.updated_at_ms
        assert await store.count_history(instance_id, reason="claimed") == 1
    for instance_id, row in untouched.items():
        assert await store.get_instance(instance_id) == row
    assert await store.count_history(again, reason="claimed") == 1


async def test_claim_many_edge_cases(store: SqlStore, make_new: MakeNew, advance: Advance) -> None:
    a = await _dispatched(store, make_new, advance, "a")
    row = await store.get_instance(a)

    assert await store.claim_many([], owner="x") == {}
    with pytest.raises(ValueError, match="lease_s"):
        await store.claim_many([ClaimRequest(a, 0, 30), ClaimRequest(a, 0, 0)], owner="x")
    assert await store.get_instance(a) == row

    # Named twice: the first request expecting the row's attempt wins, once.
    claimed = await store.claim_many([ClaimRequest(a, 7, 10), ClaimRequest(a, 0, 20)], owner="x")

    assert list(claimed) == [a]
    assert claimed[a].lease_expires_at_ms >= claimed[a].row.updated_at_ms + 20_000
    assert await store.count_history(a, reason="claimed") == 1


async def test_concurrent_claim_many_wins_each_id_once(store: SqlStore, db_url: str) -> None:
    ids = await _seed(store, (f"c{n:02d}" for n in range(50)))
    requests = [ClaimRequest(i, 0, 30) for i in ids]
    other = await SqlStore.connect(db_url)
    try:
        one, two = await asyncio.gather(
            store.claim_many(requests, owner="one"),
            other.claim_many(requests[::-1], owner="two"),
        )
    finally:
        await other.close()

    assert set(one).isdisjoint(two)
    assert set(one) | set(two) == set(ids)
    for winners, owner in ((one, "one"), (two, "two")):
        assert all(c.row.lease_owner == owner and c.token == 1 for c in winners.values())
    claimed = instance_history.c.reason == "claimed"
    assert await _count(store, instance_history, claimed) == 50


async def test_claim_many_spans_chunks(store: SqlStore) -> None:
    count = 2 * sql_queries.CHUNK + 50
    ids = await _seed(store, (f"c{n:04d}" for n in range(count)))
    requests = [ClaimRequest(i, 0, 30) for i in ids] + [ClaimRequest("inst-none", 0, 30)]

    claimed = await store.claim_many(requests[::-1], owner="x")

    assert set(claimed) == set(ids)
    assert await _count(store, instance_history, instance_history.c.reason == "claimed") == count
    running = task_instances.c.status == Status.RUNNING.value
    assert await _count(store, task_instances, running, task_instances.c.attempt == 1) == count


# extend_leases


async def test_extend_leases_extends_and_returns_only_held_rows(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    held, token = await _running(store, make_new, advance, "held")
    stale, stale_token = await _running(store, make_new, advance, "stale")
    waiting = await _dispatched(store, make_new, advance, "waiting")
    before = {i: await store.get_instance(i) for i in (held, stale, waiting)}
    history = {i: await store.history(i) for i in (held, stale, waiting)}

    assert await store.extend_leases([], lease_s=600) == set()
    now = await store.db_now_ms()
    still = await store.extend_leases(
        [(held, token), (held, token - 1), (stale, stale_token + 1), (waiting, 0), ("gone", 1)],
        lease_s=600,
    )

    assert still == {(held, token)}
    row, old = await store.get_instance(held), before[held]
    assert row is not None
    assert old is not None
    assert row.lease_expires_at_ms is not None
    assert row.lease_expires_at_ms >= now + 600_000
    assert dataclasses.replace(row, lease_expires_at_ms=old.lease_expires_at_ms) == old
    for instance_id in (stale, waiting):
        assert await store.get_instance(instance_id) == before[instance_id]
    for instance_id, rows in history.items():
        assert await store.history(instance_id) == rows
    with pytest.raises(ValueError, match="lease_s"):
        await store.extend_leases([(held, token)], lease_s=0)


# finish_many


async def test_finish_many_commits_winners_and_fences_only_the_others(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    done, done_t = await _running(store, make_new, advance, "done", owner="exec-1")
    retry, retry_t = await _running(store, make_new, advance, "retry", owner="exec-2")
    stale, stale_t = await _running(store, make_new, advance, "stale")
    taken, taken_t = await _running(store, make_new, advance, "taken")
    first, first_t = await _running(store, make_new, advance, "first")
    second, second_t = await _running(store, make_new, advance, "second")
    waiting = await _dispatched(store, make_new, advance, "waiting")
    await _record_key(store, "k:old")
    fenced = (stale, taken, second, waiting)
    before = {i: (await store.get_instance(i), await store.history(i)) for i in fenced}
    fatal = FailClass.FATAL
    requests = [
        FinishRequest(done, done_t, Status.SUCCESS, "done", {"n": 1}, side_effects=("k:a", "k:a")),
        FinishRequest(retry, retry_t, Status.RETRYING, "503", error="boom", next_attempt_at_ms=9),
        FinishRequest(stale, stale_t + 1, Status.SUCCESS, "late", side_effects=("k:stale",)),
        FinishRequest(taken, taken_t, Status.SUCCESS, "dup", side_effects=("k:fresh", "k:old")),
        FinishRequest(
            first, first_t, Status.FAILED, "bad", fail_class=fatal, side_effects=("k:s",)
        ),
        FinishRequest(second, second_t, Status.SUCCESS, "twin", side_effects=("k:s",)),
        FinishRequest(waiting, 0, Status.TIMEOUT, "sweep"),
        FinishRequest("inst-missing", 1, Status.SUCCESS, "ghost"),
    ]

    with statements(store) as sent:
        results = await store.finish_many(requests)

    # Known and repeated keys were settled inside the batch, without the per-run fallback.
    assert len(sent) == 5
    assert results == {
        done: CasResult(ok=True),
        retry: CasResult(ok=True),
        stale: CasResult(ok=False, found=Status.RUNNING),
        taken: CasResult(ok=False, found=Status.RUNNING),
        first: CasResult(ok=True),
        second: CasResult(ok=False, found=Status.RUNNING),
        waiting: CasResult(ok=False, found=Status.DISPATCHED),
        "inst-missing": CasResult(ok=False, found=None),
    }
    for instance_id, (row, history) in before.items():
        assert await store.get_instance(instance_id) == row
        assert await store.history(instance_id) == history
    rows = {i: await store.get_instance(i) for i in (done, retry, first)}
    assert [
        (r.status, r.result, r.fail_class, r.last_error, r.next_attempt_at_ms, r.lease_owner)
        for r in rows.values()
        if r is not None
    ] == [
        (Status.SUCCESS, {"n": 1}, None, None, None, None),
        (Status.RETRYING, None, None, "boom", 9, None),
        (Status.FAILED, None, FailClass.FATAL, None, None, None),
    ]
    for instance_id, owner, reason in ((done, "exec-1", "done"), (retry, "exec-2", "503")):
        last = (await store.history(instance_id))[-1]
        assert (last.from_status, last.attempt, last.owner, last.reason) == (
            Status.RUNNING,
            1,
            owner,
            reason,
        )
        row = rows[instance_id]
        assert row is not None
        assert (last.to_status, last.at_ms) == (row.status, row.updated_at_ms)
    done_keys = {k: await store.side_effect_done(k) for k in ("k:a", "k:s", "k:stale", "k:fresh")}
    assert done_keys == {"k:a": True, "k:s": True, "k:stale": False, "k:fresh": False}


async def test_a_finish_that_asks_for_review_queues_it_only_when_it_wins(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """The review entry is written with the final CAS, in its transaction: a winner is FAILED
    and queued together, a fenced run queues nothing."""
    won, won_t = await _running(store, make_new, advance, "won")
    lost, lost_t = await _running(store, make_new, advance, "lost")
    review = FailClass.MANUAL_REVIEW
    requests = [
        FinishRequest(
            r_id,
            token,
            Status.FAILED,
            "needs_review",
            fail_class=review,
            owner="exec-1",
            review=why,
        )
        for r_id, token, why in ((won, won_t, "unsure"), (lost, lost_t + 1, "stale"))
    ]
    results = await store.finish_many(requests)
    assert results == {won: CasResult(ok=True), lost: CasResult(ok=False, found=Status.RUNNING)}
    async with store.engine.connect() as conn:
        stmt = select(review_queue.c.instance_id, review_queue.c.reason)
        queued = [tuple(r) for r in (await conn.execute(stmt)).all()]
    assert queued == [(won, "unsure")]
    row = await store.get_instance(won)
    assert row is not None and (row.status, row.fail_class) == (Status.FAILED, review)


async def test_a_result_encoded_by_the_caller_is_stored_as_given(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """`result_json` is kept as the text of the result, on the unread path (owner named) and
    on the locking one, and reads back as the result."""
    unread, unread_t = await _running(store, make_new, advance, "unread")
    locked, locked_t = await _running(store, make_new, advance, "locked")
    result = {"b": [1, 2.5], "a": "é"}
    text = stored_json(result)
    await store.finish_many(
        [
            FinishRequest(
                unread,
                unread_t,
                Status.SUCCESS,
                "completed",
                result,
                owner="exec-1",
                result_json=text,
            )
        ]
    )
    await store.finish_many(
        [FinishRequest(locked, locked_t, Status.SUCCESS, "completed", result, result_json=text)]
    )
    async with store.engine.connect() as conn:
        stmt = select(task_instances.c.result).order_by(task_instances.c.id)
        assert [r for (r,) in (await conn.execute(stmt)).all()] == [text, text]
    for instance_id in (unread, locked):
        row = await store.get_instance(instance_id)
        assert row is not None and row.result == result


async def test_finish_many_rejects_a_bad_batch_before_any_sql(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    a, token = await _running(store, make_new, advance, "a")
    row = await store.get_instance(a)
    good = FinishRequest(a, token, Status.SUCCESS, "ok")

    assert await store.finish_many([]) == {}
    with pytest.raises(InvalidTransition):
        await store.finish_many([good, FinishRequest("b", 1, Status.PENDING, "no")])
    with pytest.raises(InvalidTransition):
        await store.finish_many([good, FinishRequest("b", 1, Status.FAILED, "no class")])
    with pytest.raises(ValueError, match="once"):
        await store.finish_many([good, good])
    assert await store.get_instance(a) == row


async def test_finish_many_falls_back_when_a_key_is_taken_after_the_check(
    store: SqlStore, make_new: MakeNew, advance: Advance, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _record_key(store, "k:old")
    a, a_t = await _running(store, make_new, advance, "a")
    b, b_t = await _running(store, make_new, advance, "b")

    async def nothing_recorded(conn: Any, keys: Any) -> set[str]:
        # As if a concurrent writer committed "k:old" right after the pre-check.
        return set()

    monkeypatch.setattr(sql_queries, "recorded_keys", nothing_recorded)
    results = await store.finish_many(
        [
            FinishRequest(a, a_t, Status.SUCCESS, "ok", side_effects=("k:a",)),
            FinishRequest(b, b_t, Status.SUCCESS, "ok", side_effects=("k:b", "k:old")),
        ]
    )

    assert results == {a: CasResult(ok=True), b: CasResult(ok=False, found=Status.RUNNING)}
    assert await store.count_history(a, reason="ok") == 1
    assert await store.count_history(b, reason="ok") == 0
    assert (await store.side_effect_done("k:a"), await store.side_effect_done("k:b")) == (
        True,
        False,
    )


async def test_side_effect_keys_differing_only_by_trailing_spaces_are_distinct(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    await _record_key(store, "k")
    a, a_t = await _running(store, make_new, advance, "a")
    b, b_t = await _running(store, make_new, advance, "b")

    results = await store.finish_many(
        [
            FinishRequest(a, a_t, Status.SUCCESS, "ok", side_effects=("k ",)),
            FinishRequest(b, b_t, Status.SUCCESS, "ok", side_effects=("k  ", "k:b")),
        ]
    )

    assert results == {a: CasResult(ok=True), b: CasResult(ok=True)}
    done = [await store.side_effect_done(k) for k in ("k", "k ", "k  ", "k   ")]
    assert done == [True, True, True, False]


# finish_many == sequential finish


def _plan(rng: random.Random, size: int) -> list[tuple[str, str, FinishRequest]]:
    """Random runs, shuffled: (kind of row, its lease owner, the finish request), with ids
    and side-effect keys (from a small pool, some repeated) still to be tagged per twin set."""
    plan = []
    for n in range(size):
        kind = rng.choice(["held", "held", "held", "stale", "waiting", "missing"])
        dst = rng.choice([Status.SUCCESS, Status.FAILED, Status.RETRYING, Status.TIMEOUT])
        keys = rng.sample(["k0", "k1", "k2", "k3", "k4", "old"], rng.randint(0, 2))
        request = FinishRequest(
            str(n),
            rng.choice([1, 3]) if kind == "stale" else 2,
            dst,
            f"reason {n}",
            result=rng.choice([None, {"n": n}, [n, "x"]]),
            fail_class=rng.choice(list(FailClass)) if dst is Status.FAILED else None,
            error=rng.choice([None, f"error {n}"]),
            next_attempt_at_ms=T0_MS + n if dst is Status.RETRYING else None,
            side_effects=(*keys, *keys[:1]),
        )
        plan.append((kind, rng.choice(["exec-1", "exec-2"]), request))
    rng.shuffle(plan)
    return plan


async def _apply_plan(
    store: SqlStore, plan: list[tuple[str, str, FinishRequest]], tag: str
) -> list[FinishRequest]:
    """Seed one twin set (rows at attempt 2, the key "old" recorded); its tagged requests."""
    for kind, owner, r in plan:
        if kind in ("held", "stale"):
            await _seed(store, [tag + r.instance_id], status=Status.RUNNING, attempt=2, owner=owner)
        elif kind == "waiting":
            await _seed(store, [tag + r.instance_id], attempt=2)
    await _record_key(store, f"{tag}old")
    return [
        dataclasses.replace(
            r,
            instance_id=f"inst-{tag}{r.instance_id}",
            side_effects=tuple(tag + k for k in r.side_effects),
        )
        for _, _, r in plan
    ]


async def _outcome(store: SqlStore, tag: str, size: int) -> list[Any]:
    """Every row, history and side effect of one twin set, with the set's tag removed."""
    seen: list[Any] = []
    for n in range(size):
        row: InstanceRow | None = await store.get_instance(f"inst-{tag}{n}")
        if row is not None:
            row = dataclasses.replace(row, id="", dedupe_key="", updated_at_ms=0)
        history = [
            (h.from_status, h.to_status, h.attempt, h.owner, h.reason)
            for h in await store.history(f"inst-{tag}{n}")
        ]
        seen.append((n, row, history))
    key = side_effects.c.idempotency_key
    stmt = select(key, side_effects.c.instance_id, side_effects.c.attempt)
    async with store.engine.connect() as conn:
        rows = (await conn.execute(stmt.where(key.like(f"{tag}%")))).all()
    prefix = f"inst-{tag}"
    seen.append(sorted((k.removeprefix(tag), i.removeprefix(prefix), a) for k, i, a in rows))
    return seen


async def test_finish_many_equals_sequential_finish(store: SqlStore) -> None:
    size = 14
    for seed in (1, 2, 3):
        plan = _plan(random.Random(seed), size)
        batch_tag, single_tag = f"A{seed}-", f"B{seed}-"
        batch = await _apply_plan(store, plan, batch_tag)
        single = await _apply_plan(store, plan, single_tag)

        results = await store.finish_many(batch)
        expected = {}
        for r in single:
            expected[r.instance_id] = await store.finish(
                r.instance_id,
                token=r.token,
                dst=r.dst,
                reason=r.reason,
                result=r.result,
                fail_class=r.fail_class,
                error=r.error,
                next_attempt_at_ms=r.next_attempt_at_ms,
                side_effects=list(r.side_effects),
            )

        assert [(i.removeprefix(f"inst-{batch_tag}"), c) for i, c in results.items()] == [
            (i.removeprefix(f"inst-{single_tag}"), c) for i, c in expected.items()
        ]
        assert any(c.ok for c in results.values())
        assert not all(c.ok for c in results.values())
        assert await _outcome(store, batch_tag, size) == await _outcome(store, single_tag, size)


# statements per batch


async def test_batches_send_a_constant_number_of_statements(store: SqlStore) -> None:
    counts = []
    for size in (3, 40):
        ids = await _seed(store, (f"s{size}-{n:02d}" for n in range(size)))
        await store.claim_many([ClaimRequest(ids[0], 0, 30)], owner="warm-up")

        with statements(store) as claims:
            claimed = await store.claim_many([ClaimRequest(i, 0, 30) for i in ids], owner="x")
        with statements(store) as leases:
            held = await store.extend_leases([(i, c.token) for i, c in claimed.items()], lease_s=60)
        finishing = [
            FinishRequest(i, 1, Status.SUCCESS, "ok", {"i": i}, side_effects=(i,)) for i in ids
        ]
        with statements(store) as finishes:
            results = await store.finish_many(finishing)

        assert (len(claimed), len(held)) == (size - 1, size - 1)
        assert all(c.ok for c in results.values())
        counts.append((len(claims), len(leases), len(finishes)))

    # claims: lock and read, update, history; leases: lock, update;
    # finishes: lock, key check, update, history, side effects.
    assert counts == [(3, 2, 5), (3, 2, 5)]
