"""`retry` and `dead replay` run as a Redis user that may not publish (its ACL denies XADD):
the store's FAILED -> PENDING commits before the publish, so the requeue stands and the
reconciler publishes it, as with Redis down. The command says so and exits 0; it must not
report a failure (and `dead replay` keep the letter) for a requeue that was made. Real
Redis with an ACL user of the test's own, real store."""

from __future__ import annotations

import pytest

from taskstream.core import operations, streams
from taskstream.core import streams_admin as admin
from taskstream.core.protocol import Keys
from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness
from tests.integration.test_operations import TASKS, ghost_and_garbage_letters
from tests.support.acl import acl_user, as_user, namespace_rules


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS.replace("nobody-knows-me", "echo"))
    return harness


async def _published_by_the_reconciler(h: Harness, instance_id: str) -> None:
    h.clock.advance(60_000)
    assert await h.reconciler().reconcile() == 1
    assert instance_id in await admin.instance_ids(h.redis, h.keys)


async def test_a_retry_whose_publish_redis_denies_says_the_requeue_stands(
    h: Harness, db_url: str, redis_url: str
) -> None:
    row = await h.trigger(TASKS, "once-fails")
    await h.run_until(row.id, Status.FAILED)
    rules = [*namespace_rules(h.keys), "-xadd"]
    async with acl_user(h.redis, redis_url, rules) as (user, _):
        url = as_user(redis_url, user)
        out = await run_cli(h, db_url, url, "retry", row.id, "--reason", "fixed")
    assert out.exit_code == 0, out.output
    assert out.stdout == f"{row.id}: requeued\n"
    assert "not published yet (redis refused XADD" in out.stderr
    assert "the reconciler publishes it" in out.stderr
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is Status.PENDING
    await _published_by_the_reconciler(h, row.id)


async def test_a_replay_whose_publish_redis_denies_drops_the_letter_it_acted_on(
    h: Harness, db_url: str, redis_url: str
) -> None:
    row = await ghost_and_garbage_letters(h)
    [letter] = [
        x
        for x in await operations.dead_letters(h.redis, h.keys.dead, limit=10)
        if x.instance_id == row.id
    ]
    rules = [*namespace_rules(h.keys), "-xadd"]
    async with acl_user(h.redis, redis_url, rules) as (user, _):
        url = as_user(redis_url, user)
        out = await run_cli(h, db_url, url, "dead", "replay", letter.dead_id)
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(f"{letter.dead_id}: requeued, not published yet (redis refused")
    assert await operations.dead_letter(h.redis, h.keys.dead, letter.dead_id) is None
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is Status.PENDING
    await _published_by_the_reconciler(h, row.id)


async def test_a_replay_whose_letter_redis_will_not_drop_says_what_it_did(
    h: Harness, db_url: str, redis_url: str
) -> None:
    """The requeue was made; the letter stays (its user may not XDEL): the line says both,
    as when Redis fails at that step, and the exit is 1."""
    row = await ghost_and_garbage_letters(h)
    [letter] = [
        x
        for x in await operations.dead_letters(h.redis, h.keys.dead, limit=10)
        if x.instance_id == row.id
    ]
    rules = [*namespace_rules(h.keys), "-xdel"]
    async with acl_user(h.redis, redis_url, rules) as (user, _):
        url = as_user(redis_url, user)
        out = await run_cli(h, db_url, url, "dead", "replay", letter.dead_id)
    assert out.exit_code == 1, out.output
    assert out.stdout.startswith(f"{letter.dead_id}: requeued; letter kept (redis refused XDEL")
    assert await operations.dead_letter(h.redis, h.keys.dead, letter.dead_id) == letter
    after = await h.store.get_instance(row.id)
    assert after is not None and after.status is Status.DISPATCHED
