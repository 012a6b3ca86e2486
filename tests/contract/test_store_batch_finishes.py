"""Batches of finishes: `finish_many` commits the runs that still hold their rows and fences
the others, which change nothing (row, history, review entry or side-effect key); it stores a
result encoded by the caller as given, refuses a bad batch before any SQL, falls back when a
side-effect key is taken after its check, and tells apart keys that differ only by trailing
spaces."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from taskstream.core.errors import InvalidTransition
from taskstream.core.states import FailClass, Status
from taskstream.core.store import sql_queries
from taskstream.core.store.port import CasResult, FinishRequest
from taskstream.core.store.records import stored_json
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import review_queue, task_instances
from tests.contract.conftest import Advance, MakeNew
from tests.contract.store_batch_cases import _dispatched, _record_key, _running
from tests.support.statements import statements


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
    and queued together, a fenced run queues nothing. A reason UTF-8 cannot encode is stored
    with the character replaced, not refused with the whole commit."""
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
        for r_id, token, why in ((won, won_t, "unsure \udc80"), (lost, lost_t + 1, "stale"))
    ]
    results = await store.finish_many(requests)
    assert results == {won: CasResult(ok=True), lost: CasResult(ok=False, found=Status.RUNNING)}
    async with store.engine.connect() as conn:
        stmt = select(review_queue.c.instance_id, review_queue.c.reason)
        queued = [tuple(r) for r in (await conn.execute(stmt)).all()]
    assert queued == [(won, "unsure ?")]  # a lone surrogate (model output) cannot be stored
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


async def test_texts_holding_a_nul_are_stored_with_it_replaced_not_refused(
    store: SqlStore, make_new: MakeNew, advance: Advance
) -> None:
    """An agent's error text or review reason holding a NUL (binary data in a message), which
    PostgreSQL's text refuses: the run's end is stored on every kind, the NUL as U+FFFD,
    rather than refused and the run failed `commit_refused`."""
    failed, failed_t = await _running(store, make_new, advance, "nul-error")
    review, review_t = await _running(store, make_new, advance, "nul-review")
    requests = [
        FinishRequest(
            failed,
            failed_t,
            Status.RETRYING,
            "error",
            error="bad byte \x00 in input",
            next_attempt_at_ms=9,
            owner="exec-1",
        ),
        FinishRequest(
            review,
            review_t,
            Status.FAILED,
            "needs_review",
            fail_class=FailClass.MANUAL_REVIEW,
            owner="exec-1",
            review="odd \x00 output",
        ),
    ]
    assert await store.finish_many(requests) == {
        failed: CasResult(ok=True),
        review: CasResult(ok=True),
    }
    row = await store.get_instance(failed)
    assert row is not None and (row.status, row.last_error) == (
        Status.RETRYING,
        "bad byte \ufffd in input",
    )
    async with store.engine.connect() as conn:
        stmt = select(review_queue.c.reason).where(review_queue.c.instance_id == review)
        assert (await conn.execute(stmt)).scalar_one() == "odd \ufffd output"
