"""An entry left over from an instance's earlier life (before a manual requeue) on real Redis
and a real store: when the new life fails as poison before any claim, at the attempt just
after the old entry's, the old entry is acked, not taken for the run it would have started
and dead-lettered as a second letter."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from taskstream.core import operations, streams
from taskstream.core.protocol import GROUP, decode
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, FinishRequest
from tests.integration.harness import Harness
from tests.integration.outages import fail_next_dead_letter, intake
from tests.integration.test_operations import TASKS, h

__all__ = ["h"]  # the fixture, shared with test_operations


async def _poisoned_then_letter_lost(
    h: Harness, monkeypatch: pytest.MonkeyPatch, reader: str
) -> tuple[str, streams.Delivery]:
    """Life 1: `reader` (no liveness key: gone) read the instance's entry (attempt 0); the
    sweeper failed the instance as poison and Redis failed before the entry reached the
    dead-letter stream. The operator then fixed the cause and requeued it (attempt 1).
    Returns the instance id and the old entry, still pending in `reader`'s list."""
    row = await h.trigger(TASKS, "once-fails")
    [old] = await streams.read(h.redis, h.keys, reader, count=1, block_ms=10)
    fail_next_dead_letter(monkeypatch)
    with pytest.raises(RedisConnectionError):
        await h.sweeper(max_deliveries=0).sweep_once()  # 1 delivery > 0: poison
    failed = await h.store.get_instance(row.id)
    assert failed is not None
    assert (failed.status, failed.fail_class, failed.attempt) == (
        Status.FAILED,
        FailClass.POISON,
        0,
    )
    said = await operations.requeue(h.outbox, row.id, who="ops", why="fixed", now_ms=0)
    assert said is None
    return row.id, old


async def _new_life_poisoned_unclaimed(h: Harness, instance_id: str) -> None:
    """Life 2: the requeue's entry (attempt 1) is failed as poison before any claim and
    dead-lettered, as an executor that does not know its agent does."""
    [new] = await streams.read(h.redis, h.keys, "c2", count=1, block_ms=10)
    assert decode(new.fields).attempt == 1
    poisoned = await h.store.transition(
        instance_id,
        Status.DISPATCHED,
        Status.FAILED,
        reason="unknown_agent",
        attempt=1,
        fail_class=FailClass.POISON,
    )
    assert poisoned.ok
    assert await streams.dead_letter(h.redis, h.keys, new, "unknown_agent", "flaky")


async def _letters_and_pending(h: Harness, old: streams.Delivery) -> tuple[list[str], int]:
    """The attempts the dead letters name, and how many entries are still pending."""
    letters = await operations.dead_letters(h.redis, h.keys.dead, limit=10)
    pending: Any = await h.redis.xpending(old.stream, GROUP)
    return [letter.fields["orig.attempt"] for letter in letters], int(pending["pending"])


async def test_the_sweeper_acks_an_earlier_lifes_entry_after_the_next_life_is_poisoned(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 is the requeue's, not the run the old entry (attempt 0) started: the sweeper
    acks that entry instead of writing a second letter for attempt 1's failure."""
    instance_id, old = await _poisoned_then_letter_lost(h, monkeypatch, "doomed-1")
    await _new_life_poisoned_unclaimed(h, instance_id)

    counts = await h.sweeper(max_deliveries=0).sweep_once()

    assert (counts.get("ack"), counts.get("dead_letter")) == (1, None), counts
    assert await _letters_and_pending(h, old) == (["1"], 0)


async def test_a_waking_consumer_acks_an_earlier_lifes_entry_after_the_next_life_is_poisoned(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c1 read the entry of attempt 0 and paused before claiming it; meanwhile the instance
    was poisoned, requeued, and poisoned again at attempt 1. c1 wakes: its claim loses to the
    FAILED row, and its entry, of the earlier life, is acked, not a second letter."""
    instance_id, old = await _poisoned_then_letter_lost(h, monkeypatch, "c1")
    await _new_life_poisoned_unclaimed(h, instance_id)

    assert await (await intake(h, "c1")).admit([old]) == []

    assert await _letters_and_pending(h, old) == (["1"], 0)


async def test_the_run_an_entry_started_after_a_requeue_still_owes_its_letter(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requeue's entry (attempt 1) was claimed (attempt 2) by c2, whose run was failed as
    poison; Redis failed before the entry reached the dead-letter stream. That entry started
    the run that failed: the sweeper owes, and writes, its letter."""
    instance_id, old = await _poisoned_then_letter_lost(h, monkeypatch, "doomed-1")
    assert (await h.sweeper().sweep_once()).get("ack") == 1  # the old life's entry
    [new] = await streams.read(h.redis, h.keys, "c2", count=1, block_ms=10)
    won = await h.store.claim_many([ClaimRequest(instance_id, 1, 60)], owner="c2")
    assert won[instance_id].token == 2
    poison = FinishRequest(
        instance_id, 2, Status.FAILED, "payload_too_large", fail_class=FailClass.POISON
    )
    assert (await h.store.finish_many([poison]))[instance_id].ok

    counts = await h.sweeper().sweep_once()  # "c2" has no liveness key: taken at once

    assert counts.get("dead_letter") == 1, counts
    dead: Any = await h.redis.xrange(h.keys.dead)
    assert [(f[b"reason"], f[b"source_id"].decode()) for _, f in dead] == [
        (b"payload_too_large", new.entry_id)
    ]
    assert await _letters_and_pending(h, old) == (["1"], 0)
