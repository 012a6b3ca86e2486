"""An executor stopping, on real Redis and a real store (in-process, clock passed in): a run
that ends within the grace is committed, one past it is released without spending an attempt
(also when every slot is busy), a released attempt counts neither toward the limit nor
toward the backoff, and the liveness key is there only while the executor runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskstream.core import streams
from taskstream.core.errors import StoreRefused
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.reasons import RELEASED
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from taskstream.executor.intake import Run
from tests.integration.executor_cases import TASKS, harness, reach, run_until, status_of
from tests.integration.harness import T0, Harness, Running, until


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def test_stop_lets_a_run_finish_within_the_grace(h: Harness) -> None:
    row = await h.trigger(TASKS, "slow")
    ex = Running(h.executor(grace_s=10))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    assert await status_of(h, row.id) is Status.SUCCESS


async def test_a_run_past_the_grace_is_released_without_spending_an_attempt(h: Harness) -> None:
    row = await h.trigger(TASKS, "slow-once")
    ex = Running(h.executor(grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    released = await h.store.get_instance(row.id)
    assert released is not None and released.status is Status.RETRYING
    assert released.next_attempt_at_ms is not None
    assert released.next_attempt_at_ms <= h.clock.now_ms()
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0
    await h.scheduler().run_pass()
    # max_attempts is 1: the release did not count
    await run_until(h, h.executor(grace_s=10), [row.id], Status.SUCCESS)
    done = await h.store.get_instance(row.id)
    assert done is not None and done.attempt == 2


async def test_runs_released_together_each_count_their_own_history(h: Harness) -> None:
    """Three runs released at one stop are claimed again in one batch, whose retries read
    their histories in one statement: each run's release is found in its own history, so
    each second attempt (max_attempts 1) runs instead of failing as exhausted."""
    rows = [await h.trigger(TASKS, "slow-once", fire_ms=T0 + n * 60_000) for n in range(3)]
    ex = Running(h.executor(grace_s=0.05))
    for row in rows:
        await reach(h, row.id, Status.RUNNING)
    await ex.close()
    await h.scheduler().run_pass()
    await run_until(h, h.executor(grace_s=10), [row.id for row in rows], Status.SUCCESS)
    claims = {
        (x.owner, x.at_ms)
        for r in rows
        for x in await h.store.history(r.id)
        if x.attempt == 2 and x.to_status is Status.RUNNING
    }
    assert len(claims) == 1, "the second attempts were claimed in one statement"


LONG = """
tasks:
  - id: long
    agent: slow
    timeout: 120s
    payload: {seconds: 60}
"""


async def test_stop_with_every_slot_busy_releases_after_the_grace(h: Harness) -> None:
    """With no free slot the executor waits for a run to end; a stop must end that wait,
    or the grace and the release wait for the 60 s run (and SIGKILL loses it meanwhile)."""
    await h.apply(LONG)
    row = await h.trigger(LONG, "long")
    ex = Running(h.executor(concurrency=1, grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    ex.stop.set()
    await asyncio.wait_for(ex.task, timeout=10)  # bounds a broken run only
    assert await status_of(h, row.id) is Status.RETRYING
    assert (await h.store.history(row.id))[-1].reason == RELEASED


STALLS = """
tasks:
  - id: stalls
    agent: flaky
    retry: {{max_attempts: {max_attempts}, backoff: {{base: 1s, factor: 2}}, jitter: 0}}
    payload: {{stall_until: 1, seconds: 60, fail_until: 2}}
"""


@pytest.mark.parametrize("max_attempts", [2, 5])
async def test_a_released_attempt_does_not_count(h: Harness, max_attempts: int) -> None:
    """Attempt 1 is released at shutdown (not counted); attempt 2, only the first that ran,
    fails retriably. At max_attempts 2 it is the last by the token, yet one attempt is left;
    at 5 (below the limit) its backoff is still the
    first one's: base * factor**0 = 1 s, not 2 s."""
    stalls = STALLS.format(max_attempts=max_attempts)
    h.clock.set(await h.store.db_now_ms())
    await h.apply(stalls)
    row = await h.trigger(stalls, "stalls")
    ex = Running(h.executor(grace_s=0.05))
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    assert await status_of(h, row.id) is Status.RETRYING
    await h.scheduler().run_pass()
    again = Running(h.executor())
    try:

        async def second_ended() -> bool:
            found = await h.store.get_instance(row.id)
            assert found is not None
            return found.attempt == 2 and found.status in (Status.RETRYING, Status.FAILED)

        await until(second_ended)
    finally:
        await again.close()
    ended = await h.store.get_instance(row.id)
    assert ended is not None
    assert (ended.status, ended.fail_class) == (Status.RETRYING, None)
    assert ended.next_attempt_at_ms == h.clock.now_ms() + 1000


async def test_liveness_key_is_set_while_running_and_removed_after(h: Harness) -> None:
    ex = Running(h.executor("c9"))

    async def alive() -> bool:
        return bool(await h.redis.exists(h.keys.alive("c9")))

    await until(alive)
    await ex.close()
    assert not await alive()


async def _cancelled_after_its_claim(h: Harness, hold: str) -> str:
    """Run `slow-once` on an executor whose admission the stop cancels after the claim has
    committed: `hold` names where it waits, "reply" (the claim's reply comes back only once
    the admission is cancelled) or "reads" (the reads after the claim do not answer). Returns
    the instance id. For "reads" the run is a retry (only a
    retry's claim reads histories): its first attempt was released by an earlier stop."""
    row = await h.trigger(TASKS, "slow-once")
    if hold == "reads":
        first = Running(h.executor(grace_s=0.05))
        await reach(h, row.id, Status.RUNNING)
        await first.close()
        await h.scheduler().run_pass()
    executor = h.executor(grace_s=5)
    cancelled, never = asyncio.Event(), asyncio.Event()
    claim_many, histories, admit = h.store.claim_many, h.store.histories, executor._intake.admit

    async def late_reply(*args: Any, **kwargs: Any) -> Any:
        won = await claim_many(*args, **kwargs)
        await cancelled.wait()
        return won

    async def unanswered(*args: Any, **kwargs: Any) -> Any:
        await never.wait()
        return await histories(*args, **kwargs)

    async def watched(deliveries: list[streams.Delivery]) -> list[Run]:
        try:
            return await admit(deliveries)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    executor._intake.admit = watched  # type: ignore[method-assign]
    if hold == "reply":
        h.store.claim_many = late_reply  # type: ignore[method-assign]
    else:
        h.store.histories = unanswered  # type: ignore[method-assign]
    ex = Running(executor)
    await reach(h, row.id, Status.RUNNING)
    await ex.close()
    return row.id


@pytest.mark.parametrize("hold", ["reply", "reads"])
async def test_a_claim_won_by_a_step_the_stop_cancels_is_released(h: Harness, hold: str) -> None:
    """The stop cancels the admission after its claim committed: the claim is handed back
    like a run stopped at the grace (RETRYING, due now, not counted), not left RUNNING for
    the sweeper to time out, which would spend the only attempt of `slow-once`."""
    instance_id = await _cancelled_after_its_claim(h, hold)
    released = await h.store.get_instance(instance_id)
    assert released is not None
    last = (await h.store.history(instance_id))[-1]
    attempt = 1 if hold == "reply" else 2
    assert (released.status, last.reason, last.attempt) == (Status.RETRYING, RELEASED, attempt)
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


TWO_SLOW = """
tasks:
  - id: a
    agent: slow
    payload: {seconds: 1.0}
  - id: b
    agent: slow
    payload: {seconds: 1.2}
"""
SLOW_COMMIT_S = 0.7
"""A store under load: every commit lands, each under `STEP_END_S`, the two over it."""


async def test_runs_that_end_in_the_grace_are_all_committed_by_a_slow_store(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both runs end well within the grace; their commits, one after the other, take longer
    than `STEP_END_S` together. The stop waits for them while batches keep landing: neither
    run is left RUNNING for the sweeper to time out and run again."""
    await h.apply(TWO_SLOW)
    a = await h.trigger(TWO_SLOW, "a", fire_ms=T0)
    b = await h.trigger(TWO_SLOW, "b", fire_ms=T0)
    finish_many = h.store.finish_many

    async def slow_finish(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(SLOW_COMMIT_S)
        return await finish_many(*args, **kwargs)

    monkeypatch.setattr(h.store, "finish_many", slow_finish)
    ex = Running(h.executor(grace_s=10, concurrency=2))
    await reach(h, a.id, Status.RUNNING)
    await reach(h, b.id, Status.RUNNING)
    await ex.close()
    ends = {r: await status_of(h, r) for r in (a.id, b.id)}
    assert ends == {a.id: Status.SUCCESS, b.id: Status.SUCCESS}


SEVEN = "tasks:\n" + "".join(
    f"  - id: t{i}\n    agent: slow\n    payload: {{seconds: 1.0}}\n" for i in range(7)
)
ALONE_COMMIT_S = 0.4
"""Each single-run commit lands well under `STEP_END_S`; the seven take longer together."""


async def test_runs_of_a_refused_batch_written_one_by_one_at_stop_are_all_committed(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the last batch for a value in it, so each run is written on its own:
    every one of those commits is progress, and none is cut off by the stop."""
    await h.apply(SEVEN)
    rows = [await h.trigger(SEVEN, f"t{i}", fire_ms=T0) for i in range(7)]
    finish_many = h.store.finish_many

    async def refusing_batches(requests: list[Any]) -> Any:
        if len(requests) > 1:  # a batch holding a value the store will not take
            raise StoreRefused("store: value refused")
        await asyncio.sleep(ALONE_COMMIT_S)
        return await finish_many(requests)

    monkeypatch.setattr(h.store, "finish_many", refusing_batches)
    ex = Running(h.executor(grace_s=10, concurrency=7))
    for row in rows:
        await reach(h, row.id, Status.RUNNING)
    await ex.close()
    ends = {row.id: await status_of(h, row.id) for row in rows}
    assert ends == {row.id: Status.SUCCESS for row in rows}
