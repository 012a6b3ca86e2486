"""Looking for lost dead letters on a long-lived cluster: the store deletes nothing, so it holds
many instances FAILED `poison`, nearly all with their letter on the stream. `status` and `dead
list` judge only the latest poison failures and say so, and the dead-letter stream is read only
as far back as the oldest failure judged can have a letter; real Redis, real store."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import bindparam, update

from taskstream.core import lost_letters, streams
from taskstream.core.protocol import Keys, Priority, WorkEntry, dead_fields, encode
from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import InstanceRow
from taskstream.core.store.records import ClaimRequest, DispatchRequest, FinishRequest, NewInstance
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import task_instances
from tests.integration.cli_in_process import run_cli
from tests.integration.harness import Harness

TASKS = """
tasks:
  - id: steady
    agent: flaky
"""

MANY = 1_200
"""Instances FAILED poison, more than `status` judges."""

MINUTE_MS = 60_000
LOST_AMONG_LATEST = 500
"""The one failure among the latest whose letter is missing."""


@pytest.fixture
async def h(store: SqlStore, redis: streams.Redis, keys: Keys) -> Harness:
    harness = Harness(store, redis, keys)
    harness.clock.set(await store.db_now_ms())
    await harness.apply(TASKS)
    return harness


async def _poisoned(store: SqlStore, count: int) -> list[InstanceRow]:
    """`count` instances FAILED poison at attempt 1 (a run of entry attempt 0), made in a few
    batches; the i-th failed i minutes before the first, which failed a minute ago."""
    news = [
        NewInstance(
            id=f"i_many_{n:05d}",
            task_id="steady",
            agent="flaky",
            dedupe_key=f"steady:many:{n}",
            scheduled_for_ms=1_700_000_000_000 + n,
        )
        for n in range(count)
    ]
    ids = [x.id for x in news]
    await store.create_instances(news)
    await store.dispatch_many([DispatchRequest(i, Status.PENDING, 0) for i in ids])
    assert len(await store.claim_many([ClaimRequest(i, 0, 600) for i in ids], owner="c1")) == count
    finishes = [
        FinishRequest(i, 1, Status.FAILED, "poison", fail_class=FailClass.POISON) for i in ids
    ]
    assert all(r.ok for r in (await store.finish_many(finishes)).values())
    newest_ms = await store.db_now_ms() - MINUTE_MS
    stmt = (
        update(task_instances)
        .where(task_instances.c.id == bindparam("b_id"))
        .values(updated_at_ms=bindparam("b_ms"))
    )
    async with store.engine.begin() as conn:
        await conn.execute(
            stmt, [{"b_id": i, "b_ms": newest_ms - n * MINUTE_MS} for n, i in enumerate(ids)]
        )
    rows = [await store.get_instance(i) for i in ids]
    return [r for r in rows if r is not None]


async def _lettered(
    redis: streams.Redis, keys: Keys, rows: list[InstanceRow], *, at: str | None = None
) -> list[int]:
    """Dead letters of `rows`, each written a second after its instance failed (or with the
    id `at`), as the sweeper writes them (the entry of attempt 0, whose run failed); their
    ids' times."""
    at_ms = []
    async with redis.pipeline(transaction=False) as pipe:
        for row in sorted(rows, key=lambda r: r.updated_at_ms):
            entry = WorkEntry(
                instance_id=row.id,
                task_id=row.task_id,
                agent=row.agent,
                attempt=0,
                scheduled_for_ms=row.scheduled_for_ms,
                emitted_at_ms=row.scheduled_for_ms,
            )
            source = keys.stream(Priority.DEFAULT)
            fields = dead_fields(
                encode(entry), reason="poison", detail="swept", stream=source, entry_id="1-1"
            )
            at_ms.append(row.updated_at_ms + 1_000)
            pipe.xadd(keys.dead, fields, id=at or f"{at_ms[-1]}-0")  # type: ignore[arg-type]
        await pipe.execute()
    return at_ms


def _unwrapped(text: str) -> str:
    """`text` with every run of whitespace (a line break where rich wrapped) one space."""
    return " ".join(text.split())


def _count_letters_read(monkeypatch: pytest.MonkeyPatch, dead_key: str) -> list[int]:
    """Letters read from `dead_key` by any client of this process (the CLI's too), one count
    per XRANGE or XREVRANGE."""
    read: list[int] = []
    cls = streams.Redis

    def counting(name: str) -> Callable[..., Awaitable[Any]]:
        original = getattr(cls, name)

        async def call(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
            rows = await original(self, key, *args, **kwargs)
            if streams.as_text(key) == dead_key:
                read.append(len(rows))
            return rows

        return call

    for name in ("xrange", "xrevrange"):
        monkeypatch.setattr(cls, name, counting(name))
    return read


async def test_status_judges_the_latest_poison_failures_and_says_so(
    h: Harness, db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,200 poison failures, each lettered but one among the latest 1,000 and the oldest
    200: `status` finds the one, says it judged the latest 1,000 (the older failures are
    not looked at), and reads only the letters as recent as the oldest of those, less the
    margin for the skew between the database's and Redis's clocks."""
    rows = await _poisoned(h.store, MANY)
    judged = lost_letters.LOST_EXAMINED
    lettered = [r for n, r in enumerate(rows) if n != LOST_AMONG_LATEST]
    letters_ms = await _lettered(h.redis, h.keys, lettered[: judged + 100])
    read = _count_letters_read(monkeypatch, h.keys.dead)

    status = await run_cli(h, db_url, redis_url, "status", "--json")

    assert status.exit_code == 0, status.output
    data = json.loads(status.stdout)
    assert data["lost_letters"] == 1
    assert data["lost_letters_examined"] == judged
    assert data["lost_letters_all_examined"] is False
    since_ms = rows[judged - 1].updated_at_ms - lost_letters.CLOCK_MARGIN_MS
    assert sum(read) == sum(1 for ms in letters_ms if ms >= since_ms) < len(letters_ms)
    human = await run_cli(h, db_url, redis_url, "status")
    assert "lost: 1 among the latest 1,000 poison failures" in human.stdout


async def test_dead_list_judges_the_latest_poison_failures_and_says_so(
    h: Harness, db_url: str, redis_url: str
) -> None:
    rows = await _poisoned(h.store, MANY)
    lettered = [r for n, r in enumerate(rows) if n != LOST_AMONG_LATEST]
    await _lettered(h.redis, h.keys, lettered[: lost_letters.LOST_EXAMINED + 100])

    listed = await run_cli(h, db_url, redis_url, "dead", "list", "--limit", "5", "--json")

    assert listed.exit_code == 0, listed.output
    lost = [x["instance_id"] for x in json.loads(listed.stdout) if x["lost"]]
    assert lost == [rows[LOST_AMONG_LATEST].id]
    assert "among the latest 1,000 poison failures" in listed.stderr
    human = await run_cli(h, db_url, redis_url, "dead", "list", "--limit", "5")
    assert rows[LOST_AMONG_LATEST].id in human.stdout
    # Rich wraps long lines at the console's width, which another test may have set.
    assert "among the latest 1,000 poison failures" in _unwrapped(human.stdout)
    await _lettered(h.redis, h.keys, [rows[LOST_AMONG_LATEST]], at="*")
    none = await run_cli(h, db_url, redis_url, "dead", "list", "--limit", "5")
    assert "lost letters: none among the latest 1,000 poison failures" in _unwrapped(none.stdout)


async def test_replay_all_and_replay_one_read_the_stream_back_to_their_failures(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dead replay --all` judges every poison failure, reading each letter once and none
    older than the oldest failure less the margin (a letter from long before, of an instance
    since requeued); `dead replay INSTANCE_ID`, the letters from its failure on."""
    rows = await _poisoned(h.store, 300)
    long_before_ms = rows[-1].updated_at_ms - 2 * lost_letters.CLOCK_MARGIN_MS
    await h.redis.xadd(h.keys.dead, {"reason": "poison"}, id=f"{long_before_ms}-0")
    letters_ms = await _lettered(h.redis, h.keys, rows[1:])
    read = _count_letters_read(monkeypatch, h.keys.dead)

    found = [x async for x in lost_letters.lost_letters(h.store, h.redis, h.keys.dead)]

    assert [x.row.id for x in found] == [rows[0].id]
    assert sum(read) == len(letters_ms)
    read.clear()
    lost = await lost_letters.lost_letter(h.store, h.redis, h.keys.dead, rows[0].id)
    assert lost.row.id == rows[0].id
    since_ms = rows[0].updated_at_ms - lost_letters.CLOCK_MARGIN_MS
    assert sum(read) == sum(1 for ms in letters_ms if ms >= since_ms) < len(letters_ms)
