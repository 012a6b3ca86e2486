"""Entries naming an agent this executor does not register: the instance fails as poison
once, its entry is dead-lettered once, and a duplicate delivery is acked, through store and
Redis failures at every step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from taskstream.core import operations, streams
from taskstream.core.definitions import DefinitionCache
from taskstream.core.errors import StoreUnavailable
from taskstream.core.outbox_entries import row_entry
from taskstream.core.protocol import GROUP, Priority
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import CasResult, ClaimRequest, InstanceRow
from tests.integration.harness import Harness
from tests.integration.outages import intake_of
from tests.support.races import dispatch_before_status_read

STRANGER = """
tasks:
  - id: stranger
    agent: no-such-agent
"""


async def _stranger_on_stream(h: Harness) -> tuple[InstanceRow, list[streams.Delivery]]:
    """A PENDING instance of an unknown agent whose entry is on the stream, read by `c1`."""
    row = await h.pending_on_stream(STRANGER, "stranger")
    deliveries = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    return row, deliveries


async def _assert_failed_once_through_dispatched(h: Harness, instance_id: str) -> None:
    failed = await h.store.get_instance(instance_id)
    assert failed is not None
    assert (failed.status, failed.fail_class) == (Status.FAILED, FailClass.POISON)
    assert [x.to_status for x in await h.store.history(instance_id)] == [
        Status.PENDING,
        Status.DISPATCHED,
        Status.FAILED,
    ]
    assert await h.redis.xlen(h.keys.dead) == 1


async def test_an_unknown_agent_read_before_the_outbox_cas_fails_the_instance_once(
    outage: Harness,
) -> None:
    """The entry is on the stream while its row is still PENDING (the outbox's XADD landed,
    its CAS to DISPATCHED not yet): the unknown agent still fails the instance as poison,
    through DISPATCHED, so the reconciler has nothing to publish (and dead-letter) again."""
    h = outage
    row, deliveries = await _stranger_on_stream(h)
    assert await intake_of(h, DefinitionCache(h.store)).admit(deliveries) == []
    await _assert_failed_once_through_dispatched(h, row.id)


async def test_an_unknown_agent_whose_row_the_outbox_moves_during_the_failed_cas_fails_once(
    outage: Harness, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under READ COMMITTED the intake's DISPATCHED -> FAILED misses the PENDING row, and the
    outbox's PENDING -> DISPATCHED commits before the store reads the status (DISPATCHED). The
    store moves the row after all (`SqlStore.transition`), so the instance fails once and no
    row stays in flight for the reconciler to publish (and dead-letter) again."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite runs one writer at a time: no commit lands between the two")
    h = outage
    row, deliveries = await _stranger_on_stream(h)
    async with dispatch_before_status_read(monkeypatch, db_url) as raced:
        assert await intake_of(h, DefinitionCache(h.store)).admit(deliveries) == []
    assert raced == [Status.DISPATCHED]
    await _assert_failed_once_through_dispatched(h, row.id)


async def _dispatched_stranger(h: Harness) -> tuple[InstanceRow, list[streams.Delivery]]:
    """`_stranger_on_stream`, its row moved on to DISPATCHED by the outbox."""
    row, deliveries = await _stranger_on_stream(h)
    assert (
        await h.store.transition(row.id, Status.PENDING, Status.DISPATCHED, reason="published")
    ).ok
    return row, deliveries


async def _assert_poison_with_letter(h: Harness, instance_id: str, d: streams.Delivery) -> None:
    failed = await h.store.get_instance(instance_id)
    assert failed is not None and failed.fail_class is FailClass.POISON
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [f[b"reason"] for _, f in dead] == [b"unknown_agent"], (
        "one letter, of the poison instance"
    )
    assert (await h.redis.xpending(d.stream, GROUP))["pending"] == 0


def _answer_lost(h: Harness, monkeypatch: pytest.MonkeyPatch, *, commit: bool) -> None:
    """The store's next transition fails after its COMMIT (`commit`) or before it."""
    transition = h.store.transition

    async def answer_lost(*args: Any, **kwargs: Any) -> CasResult:
        if commit:
            assert (await transition(*args, **kwargs)).ok
        monkeypatch.setattr(h.store, "transition", transition)
        raise StoreUnavailable("store: connection lost")

    monkeypatch.setattr(h.store, "transition", answer_lost)


def _fails_once(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, exc: Exception) -> None:
    """`owner.name` raises `exc` on its next call, then is itself again."""
    real = getattr(owner, name)

    async def fails(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(owner, name, real)
        raise exc

    monkeypatch.setattr(owner, name, fails)


Fault = Callable[[Harness, pytest.MonkeyPatch], type[Exception]]
"""Installs one failure for the next admission; returns the error that admission raises."""


def _move_answer_lost(h: Harness, monkeypatch: pytest.MonkeyPatch) -> type[Exception]:
    _answer_lost(h, monkeypatch, commit=True)
    return StoreUnavailable


def _letter_fails(_h: Harness, monkeypatch: pytest.MonkeyPatch) -> type[Exception]:
    _fails_once(monkeypatch, streams, "dead_letter", RedisConnectionError("reset by peer"))
    return RedisConnectionError


def _history_fails(h: Harness, monkeypatch: pytest.MonkeyPatch) -> type[Exception]:
    _fails_once(monkeypatch, h.store, "history", StoreUnavailable("store: down again"))
    return StoreUnavailable


@pytest.mark.parametrize(
    "faults",
    [
        # The move to FAILED commits and its answer is lost (the link dropped after the
        # server's COMMIT): its move then finds FAILED, its own by the history.
        [_move_answer_lost],
        # The move answers, then the XADD of the letter fails (a Redis blip).
        [_letter_fails],
        # The answer is lost, and on the next admission the history read that tells whose
        # move the FAILED is fails too.
        [_move_answer_lost, _history_fails],
    ],
    ids=["answer-lost", "letter-failed", "answer-lost-then-history-failed"],
)
async def test_an_unknown_agent_entry_whose_move_landed_gets_its_letter_through_failures(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, faults: list[Fault]
) -> None:
    """Each admission of the entry fails after its move to FAILED landed; the next one
    dead-letters the entry, as the first would have, rather than acking it as a duplicate and
    leaving a poison instance with no letter."""
    h = outage
    row, deliveries = await _dispatched_stranger(h)
    intake = intake_of(h, DefinitionCache(h.store))
    for fault in faults:
        with pytest.raises(fault(h, monkeypatch)):
            await intake.admit(deliveries)
    assert await intake.admit(deliveries) == []
    await _assert_poison_with_letter(h, row.id, deliveries[0])


async def test_a_second_unknown_agent_entry_whose_ack_failed_is_acked_not_dead_lettered(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries of one attempt: the first fails the instance and is dead-lettered; the
    second finds it FAILED, and its ack fails (Redis). Admitted again, it is still the
    duplicate it was, though the history shows this consumer's move at its attempt: acked,
    and the instance keeps one letter."""
    h = outage
    row, [first] = await _dispatched_stranger(h)
    await streams.publish_many(
        h.redis, h.keys, [(Priority.DEFAULT, row_entry(row, h.clock.now_ms()))]
    )
    [second] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    intake = intake_of(h, DefinitionCache(h.store))
    assert await intake.admit([first]) == []
    _fails_once(monkeypatch, streams, "ack", RedisConnectionError("reset by peer"))
    with pytest.raises(RedisConnectionError):
        await intake.admit([second])
    assert await intake.admit([second]) == []
    await _assert_poison_with_letter(h, row.id, second)


async def test_an_unknown_agent_entry_whose_lost_move_another_consumer_overtook_is_acked(
    outage: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move to FAILED is lost before its COMMIT; meanwhile a consumer that knows the agent
    claims the attempt through another entry and its run fails (fatal). The entry, admitted
    again, finds FAILED that is not its move: a duplicate, acked, with no letter."""
    h = outage
    row, deliveries = await _dispatched_stranger(h)
    intake = intake_of(h, DefinitionCache(h.store))
    _answer_lost(h, monkeypatch, commit=False)
    with pytest.raises(StoreUnavailable):
        await intake.admit(deliveries)
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner="c9")
    ran = await h.store.finish(
        row.id, token=1, dst=Status.FAILED, reason="fatal", fail_class=FailClass.FATAL
    )
    assert ran.ok
    assert await intake.admit(deliveries) == []
    assert await h.redis.xlen(h.keys.dead) == 0
    assert (await h.redis.xpending(deliveries[0].stream, GROUP))["pending"] == 0


async def test_an_unknown_agent_entry_of_a_run_another_consumer_holds_is_acked(
    outage: Harness,
) -> None:
    """Another consumer (one that knows the agent, as in a rolling deploy) claimed the attempt
    through a second entry before this one was read: the instance is not this consumer's to
    fail, and the entry is a duplicate delivery, acked rather than dead-lettered beside a run
    that goes on."""
    h = outage
    row, deliveries = await _stranger_on_stream(h)
    assert (
        await h.store.transition(row.id, Status.PENDING, Status.DISPATCHED, reason="published")
    ).ok
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 0, 60)], owner="c9")
    assert await intake_of(h, DefinitionCache(h.store)).admit(deliveries) == []
    held = await h.store.get_instance(row.id)
    assert held is not None and (held.status, held.lease_owner) == (Status.RUNNING, "c9")
    assert await h.redis.xlen(h.keys.dead) == 0
    [d] = deliveries
    assert (await h.redis.xpending(d.stream, GROUP))["pending"] == 0


@pytest.mark.parametrize(
    "fault", [_move_answer_lost, _letter_fails], ids=["answer-lost", "letter-failed"]
)
async def test_an_unknown_agent_entry_whose_move_a_requeue_took_back_is_acked(
    outage: Harness, monkeypatch: pytest.MonkeyPatch, fault: Fault
) -> None:
    """The entry's move to FAILED commits, and its answer or its letter is lost. The operator
    deploys the agent elsewhere and retries the instance (a new life, attempt 1), whose run
    then fails (fatal). The entry, admitted again, finds FAILED and its own move landed, but
    in the earlier life: the requeue took that failure back, so the entry is acked, as the
    sweeper acks any entry from before a requeue, not dead-lettered for a failure handled."""
    h = outage
    row, deliveries = await _dispatched_stranger(h)
    intake = intake_of(h, DefinitionCache(h.store))
    with pytest.raises(fault(h, monkeypatch)):
        await intake.admit(deliveries)
    said = await operations.requeue(h.outbox, row.id, who="ops", why="deployed", now_ms=0)
    assert said is None
    assert row.id in await h.store.claim_many([ClaimRequest(row.id, 1, 60)], owner="c9")
    ran = await h.store.finish(
        row.id, token=2, dst=Status.FAILED, reason="fatal", fail_class=FailClass.FATAL
    )
    assert ran.ok
    assert await intake.admit(deliveries) == []
    assert await h.redis.xlen(h.keys.dead) == 0
    assert (await h.redis.xpending(deliveries[0].stream, GROUP))["pending"] == 0
