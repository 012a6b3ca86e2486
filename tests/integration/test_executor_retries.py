"""An executor's attempts on real Redis and a real store (in-process, clock passed in): a
failing run is retried with backoff until it succeeds and never past its attempt limit, a
fatal or review failure fails at once, a run past its timeout or deadline times out, and a
defect around the agent fails the attempt instead of losing the run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from taskstream.core import streams
from taskstream.core.protocol import GROUP, Keys, Priority
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import review_queue
from taskstream.executor import service
from taskstream.executor.exits import contain_exits
from taskstream.executor.heartbeat import OVERRUN_S
from tests.integration.executor_cases import TASKS, harness, reach, run_until, status_of
from tests.integration.harness import Harness, Running, until


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    return await harness(store, redis, keys)


async def failed_run(h: Harness, task_id: str, **trigger: int) -> InstanceRow:
    """Trigger one instance of `task_id`, run an executor until it is FAILED, and read it."""
    row = await h.trigger(TASKS, task_id, **trigger)
    await run_until(h, h.executor(), [row.id], Status.FAILED)
    done = await h.store.get_instance(row.id)
    assert done is not None
    return done


async def test_retries_with_backoff_until_success(h: Harness) -> None:
    row = await h.trigger(TASKS, "flaky")
    ex = Running(h.executor())
    try:
        for attempt, delay_ms in ((1, 1000), (2, 2000)):
            await reach(h, row.id, Status.RETRYING)
            current = await h.store.get_instance(row.id)
            assert current is not None and current.attempt == attempt
            assert current.next_attempt_at_ms == h.clock.now_ms() + delay_ms
            await h.scheduler().run_pass()
            assert await status_of(h, row.id) is Status.RETRYING  # not due yet
            h.clock.advance(delay_ms)
            await h.scheduler().run_pass()
        await reach(h, row.id, Status.SUCCESS)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None and done.attempt == 3 and done.result == {"attempt": 3}


async def test_attempts_are_never_exceeded(h: Harness) -> None:
    row = await h.trigger(TASKS, "hopeless")
    ex = Running(h.executor())
    try:
        for _ in range(5):
            await reach(h, row.id, Status.RETRYING, Status.FAILED)
            h.clock.advance(60_000)
            await h.scheduler().run_pass()
        await reach(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.attempt, done.fail_class) == (3, FailClass.EXHAUSTED)
    runs = [x for x in await h.store.history(row.id) if x.to_status is Status.RUNNING]
    assert len(runs) == 3


@pytest.mark.parametrize(
    ("task", "fail_class"), [("fatal", FailClass.FATAL), ("review", FailClass.MANUAL_REVIEW)]
)
async def test_fatal_and_review_fail_at_once(h: Harness, task: str, fail_class: FailClass) -> None:
    done = await failed_run(h, task)
    assert (done.attempt, done.fail_class) == (1, fail_class)
    async with h.store.engine.connect() as conn:
        stmt = select(review_queue.c.reason).where(review_queue.c.instance_id == done.id)
        reviews = list((await conn.execute(stmt)).scalars())
    assert reviews == (
        ["NeedsReview: attempt 1 fails"] if fail_class is FailClass.MANUAL_REVIEW else []
    )


async def test_timeout_goes_through_timeout_to_retry(h: Harness) -> None:
    row = await h.trigger(TASKS, "too-slow")
    ex = Running(h.executor())
    try:
        await reach(h, row.id, Status.RETRYING)
        h.clock.advance(1000)
        await h.scheduler().run_pass()
        await reach(h, row.id, Status.FAILED)
    finally:
        await ex.close()
    path = [x.to_status for x in await h.store.history(row.id)]
    assert path.count(Status.TIMEOUT) == 2
    assert path[-2:] == [Status.TIMEOUT, Status.FAILED]
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert done.last_error == "TimeoutError: the attempt ran past its timeout (0.2 s)"


async def test_a_run_that_ignores_its_timeout_ends_as_a_timeout_under_retry_on(
    h: Harness,
) -> None:
    """The agent swallows its cancellation and goes on. `OVERRUN_S` past the time limit the
    executor ends the attempt as the timeout it is: `retry_on: [retriable]` leaves timeouts
    out, so the instance fails `fatal` at once (not retried as a run whose lease lapsed),
    its entry is acked, and what the agent returns later is dropped."""
    row = await h.trigger(TASKS, "stubborn")
    ex = Running(h.executor())

    async def failed_after_overrun() -> bool:
        h.clock.advance(round(OVERRUN_S * 1000))  # whenever the run started, it is past
        return await status_of(h, row.id) is Status.FAILED

    try:
        await until(failed_after_overrun)
    finally:
        await ex.close()  # waits for the agent, which returns meanwhile
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.status, done.fail_class, done.attempt) == (Status.FAILED, FailClass.FATAL, 1)
    assert done.last_error is not None and "ignoring its cancellation" in done.last_error
    reasons = [x.reason for x in await h.store.history(row.id)]
    assert "timeout" in reasons and "lease_expired" not in reasons
    assert Status.SUCCESS not in [x.to_status for x in await h.store.history(row.id)]
    pending = await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP)
    assert pending["pending"] == 0


async def test_a_cancellation_inside_the_agent_is_a_retriable_failure(h: Harness) -> None:
    """The agent's own work was cancelled (not the run): the attempt fails and is retried,
    instead of the run being dropped RUNNING until its lease runs out."""
    row = await h.trigger(TASKS, "self-cancelled")
    await run_until(h, h.executor(), [row.id], Status.RETRYING)
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.attempt, done.lease_owner) == (1, None)
    assert done.last_error is not None and done.last_error.startswith("CancelledError")
    pending = await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP)
    assert pending["pending"] == 0


@pytest.mark.parametrize("kind", ["exit", "interrupt", "generator_exit", "abort"])
async def test_an_agent_raising_what_is_not_an_exception_fails_its_attempt_only(
    h: Harness, kind: str
) -> None:
    """`sys.exit()`, `KeyboardInterrupt`, `GeneratorExit` or a library's own `BaseException`
    from agent code: the attempt is a retriable failure like any unexpected error.
    `SystemExit` and `KeyboardInterrupt` used to stop the whole executor with exit code 0,
    its other runs left RUNNING; a `GeneratorExit` or a library's `BaseException` left its
    own run RUNNING with no outcome until its lease ran out."""
    error = await _first_attempt_error(h, kind)
    names = {
        "exit": "SystemExit",
        "interrupt": "KeyboardInterrupt",
        "generator_exit": "GeneratorExit",
        "abort": "Abort",
    }
    assert error.split(":")[0] == names[kind]


async def test_sys_exit_in_a_task_an_agent_starts_fails_its_attempt_only(h: Harness) -> None:
    """The agent gathers a helper that calls `sys.exit()`: asyncio lets that out of the event
    loop from the helper's own task, past the runner. With the executor process's task
    factory the helper's awaiter gets `ExitInTask` instead, and the attempt fails."""
    loop = asyncio.get_running_loop()
    loop.set_task_factory(contain_exits)
    try:
        assert await _first_attempt_error(h, "exit_in_task") == "ExitInTask: SystemExit: 3"
    finally:
        loop.set_task_factory(None)


async def _first_attempt_error(h: Harness, kind: str) -> str:
    """Run a `flaky` instance whose first attempt fails as `kind` until it is RETRYING, the
    executor still running meanwhile; its `last_error`."""
    text = (
        "tasks:\n  - {id: odd, agent: flaky, retry: {max_attempts: 2, backoff: {base: 1s},"
        f" jitter: 0}}, payload: {{fail_until: 1, kind: {kind}}}}}\n"
    )
    await h.apply(text)
    row = await h.trigger(text, "odd")
    executor = Running(h.executor())
    try:
        await reach(h, row.id, Status.RETRYING)
        assert not executor.task.done()
    finally:
        await executor.close()
    done = await h.store.get_instance(row.id)
    assert done is not None and done.last_error is not None
    return done.last_error


async def test_a_deadline_sooner_than_the_timeout_limits_the_attempt(h: Harness) -> None:
    done = await failed_run(h, "past-deadline", fire_ms=h.clock.now_ms())
    assert done.last_error == "TimeoutError: the attempt ran past its deadline (0.3 s)"


async def test_a_defect_around_the_agent_fails_the_attempt_instead_of_losing_the_run(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever escapes `runner.execute` (it should return an end for everything but
    cancellation) becomes a retriable failure of that attempt: the run is committed and its
    entry acked, not left RUNNING until its lease runs out."""

    async def defective(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("defect")

    monkeypatch.setattr(service, "execute", defective)
    row = await h.trigger(TASKS, "slow-once")
    running = Running(h.executor())
    try:

        async def failed() -> bool:
            return await status_of(h, row.id) is Status.FAILED

        await until(failed)
    finally:
        await running.close()
    found = await h.store.get_instance(row.id)
    assert found is not None and found.last_error == "RuntimeError: defect"
    assert (await h.redis.xpending(h.keys.stream(Priority.DEFAULT), GROUP))["pending"] == 0


NO_TIMEOUT_RETRIES = """
tasks:
  - id: late
    agent: slow
    timeout: 30s
    deadline: 5s
    retry: {max_attempts: 3, backoff: {base: 1s}, jitter: 0, retry_on: [retriable]}
    payload: {seconds: 0}
"""


async def test_a_run_that_cannot_start_before_its_deadline_is_exhausted_whatever_retry_on(
    h: Harness,
) -> None:
    """Its deadline passed before an executor got to it: the attempt times out at once and
    no retry can be planned at or after the deadline, so the instance is `exhausted`, as
    docs/tasks.md says of a deadline, whatever `retry_on` says of timeouts: not `fatal`,
    the class of a run its agent declared hopeless."""
    await h.apply(NO_TIMEOUT_RETRIES)
    row = await h.trigger(NO_TIMEOUT_RETRIES, "late", fire_ms=h.clock.now_ms())
    h.clock.advance(6_000)
    await run_until(h, h.executor(), [row.id], Status.FAILED)
    done = await h.store.get_instance(row.id)
    assert done is not None
    assert (done.attempt, done.fail_class) == (1, FailClass.EXHAUSTED)
    assert done.last_error == "TimeoutError: deadline passed before the run started"
