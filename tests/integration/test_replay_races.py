"""`dead replay` against letters it cannot read, verdicts reached while it looks, another
replay or `retry` at the same time, and Redis failing after its store write."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from taskstream.cli import ops_cmds
from taskstream.core import operations, streams
from taskstream.core.errors import LetterKept, TaskstreamError
from taskstream.core.outbox import Outbox
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, InstanceRow
from tests.integration.harness import Harness
from tests.integration.test_operations import TASKS, _Cluster, _poisoned_unclaimed, h

__all__ = ["h"]  # the fixture, shared with test_operations


async def _failed_fatal(h: Harness, row: InstanceRow, *, attempt: int, token: int) -> None:
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, attempt, 60)], owner="c2")
    failed = await h.store.finish(
        row.id, token=token, dst=Status.FAILED, reason="failed", fail_class=FailClass.FATAL
    )
    assert failed.ok


@pytest.mark.parametrize("attempt", ["²", "0" * 5000])
async def test_a_letter_whose_attempt_is_not_a_number_is_no_crash(h: Harness, attempt: str) -> None:
    """`str.isdigit` takes "²", and a string of 5,000 digits, that `int` refuses: such a
    letter is read as one without an attempt, and `--all` goes on past it."""
    row = await h.trigger(TASKS, "once-fails")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    [genuine] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    await h.redis.xdel(h.keys.dead, genuine.dead_id)
    await h.redis.xadd(
        h.keys.dead, {"reason": "bad_field", "orig.instance_id": row.id, "orig.attempt": attempt}
    )
    await h.redis.xadd(h.keys.dead, {"reason": "poison", "orig.instance_id": "nobody"})
    cluster = _Cluster(h.store, h.redis, h.keys)
    with pytest.raises(TaskstreamError, match=r"^1 of 2 dead letters not replayed"):
        await ops_cmds._replay_all(cluster)  # type: ignore[arg-type]
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is not Status.FAILED


async def test_a_letter_without_a_readable_attempt_does_not_override_a_fatal_verdict(
    h: Harness,
) -> None:
    row = await h.trigger(TASKS, "once-fails")
    await _failed_fatal(h, row, attempt=0, token=1)
    await h.redis.xadd(
        h.keys.dead,
        {"reason": "bad_field", "orig.v": "1", "orig.instance_id": row.id, "orig.attempt": "x"},
    )
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    done = await operations.replay(h.outbox, letter, who="ops", now_ms=h.clock.now_ms())
    assert done.startswith("failed since, not by this letter"), done
    after = await h.store.get_instance(row.id)
    assert after is not None
    assert (after.status, after.fail_class) == (Status.FAILED, FailClass.FATAL)


Meanwhile = Callable[[InstanceRow], Awaitable[None]]


async def _replay_racing(
    h: Harness, monkeypatch: pytest.MonkeyPatch, meanwhile: Meanwhile
) -> tuple[InstanceRow, str]:
    """Replay the letter of a poisoned instance, running `meanwhile(row)` between the
    replay's judgement of the row and its requeue; the row and what the replay said."""
    row = await h.trigger(TASKS, "once-fails")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    real = operations._failed_by

    async def judged(store: object, letter: operations.DeadLetter, row: InstanceRow) -> bool:
        verdict = await real(h.store, letter, row)
        await meanwhile(row)
        return verdict

    monkeypatch.setattr(operations, "_failed_by", judged)
    return row, await operations.replay(h.outbox, letter, who="alice", now_ms=h.clock.now_ms())


async def _retried_by_bob(h: Harness, row: InstanceRow) -> None:
    await operations.requeue(h.outbox, row.id, who="bob", why="fixed", now_ms=h.clock.now_ms())


async def test_replay_does_not_requeue_a_fatal_verdict_reached_while_it_looked(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the replay's look at the row and its requeue, another operator retried the
    instance and its new run failed as fatal: the replay requeues the failure it judged, or
    nothing, and says what it found."""

    async def retried_then_fatal(row: InstanceRow) -> None:
        await _retried_by_bob(h, row)
        await _failed_fatal(h, row, attempt=1, token=2)

    row, done = await _replay_racing(h, monkeypatch, retried_then_fatal)
    assert done.startswith("failed since, not by this letter"), done
    after = await h.store.get_instance(row.id)
    assert after is not None
    assert (after.status, after.fail_class) == (Status.FAILED, FailClass.FATAL)
    assert await h.redis.xlen(h.keys.dead) == 0


async def test_a_replay_that_loses_its_requeue_to_a_retry_says_so(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    row, done = await _replay_racing(h, monkeypatch, lambda row: _retried_by_bob(h, row))
    assert done == "requeued meanwhile (DISPATCHED), left as it is"
    history = await h.store.history(row.id)
    assert [x.owner for x in history if x.reason == "requeued"] == ["bob"]
    assert await h.redis.xlen(h.keys.dead) == 0


async def test_two_replay_alls_at_once_report_what_happened(h: Harness) -> None:
    rows = []
    for n in range(3):
        fire_ms = h.clock.now_ms() - n * 60_000
        rows.append(await h.trigger(TASKS, "once-fails", fire_ms=fire_ms))
    for row in rows:
        await _poisoned_unclaimed(h, row.id, attempt=0)
    cluster = _Cluster(h.store, h.redis, h.keys)
    said = await asyncio.gather(
        ops_cmds._replay_all(cluster),  # type: ignore[arg-type]
        ops_cmds._replay_all(cluster),  # type: ignore[arg-type]
        return_exceptions=True,
    )
    assert await h.redis.xlen(h.keys.dead) == 0
    history = [x for row in rows for x in await h.store.history(row.id)]
    assert sum(1 for x in history if x.reason == "requeued") == 3
    assert list(said) == [None, None], said


async def test_a_replay_whose_redis_fails_after_the_requeue_says_what_it_did(
    h: Harness,
) -> None:
    row = await h.trigger(TASKS, "once-fails")
    await _poisoned_unclaimed(h, row.id, attempt=0)
    [letter] = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    down = streams.connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    try:
        outbox = Outbox(h.store, down, h.keys)
        with pytest.raises(LetterKept) as kept:
            await operations.replay(outbox, letter, who="ops", now_ms=h.clock.now_ms())
    finally:
        await down.aclose()
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is Status.PENDING
    assert await h.redis.xlen(h.keys.dead) == 1
    said = str(kept.value)
    assert said.startswith("requeued, not published yet (redis unavailable"), said
    assert said.endswith("; letter kept (redis unavailable: ConnectionError)"), said
