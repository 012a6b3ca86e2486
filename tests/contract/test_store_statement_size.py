"""Batches of large values are split into statements that fit the server's packet limit
(MariaDB's `max_allowed_packet`, 16 MiB by default) however their text is made: a statement
carries its values, at most 4 bytes per character (utf8mb4), and its own SQL around them.
Each row here fits on its own, so its batch must be written, never refused as a whole."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import text

from taskstream.core.errors import StoreRefused
from taskstream.core.states import Status
from taskstream.core.store import sql_chunks
from taskstream.core.store import sql_finishes as finishes
from taskstream.core.store import sql_instances as rows
from taskstream.core.store.port import CasResult, FinishRequest
from taskstream.core.store.sql import SqlStore
from tests.contract.conftest import Advance, MakeNew

EMOJI = "\U0001f600"
"""4 bytes in UTF-8 (and utf8mb4), one character of Python text; so are the next ones."""
ROWS = 4


async def _running(
    store: SqlStore, make_new: MakeNew, advance: Advance, name: str
) -> tuple[str, int]:
    await store.create_instance(make_new(name))
    await advance(f"inst-{name}", Status.DISPATCHED)
    claim = await store.claim(f"inst-{name}", expected_attempt=0, owner="w1", lease_s=30)
    assert claim is not None
    return f"inst-{name}", claim.token


async def _packet_limit(store: SqlStore) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())


async def test_writes_over_the_packet_limit_are_refused_on_every_path(
    store: SqlStore, db_url: str, make_new: MakeNew, advance: Advance
) -> None:
    """MariaDB answers a statement over its `max_allowed_packet` with error 1153 and closes
    the connection, so the rollback after it fails too ("server has gone away"). That is
    still the refusal (`StoreRefused`: the committer then ends that run `commit_refused`),
    not an outage, which the committer waits out and sends again for ever: on the engine's
    paths (a finish with side effects, a single finish, a single creation) as on the
    driver's."""
    if not db_url.startswith(("mysql", "mariadb")):
        pytest.skip("a MySQL / MariaDB limit")
    huge = "x" * (await _packet_limit(store) + 1024)
    a, a_t = await _running(store, make_new, advance, "a")
    b, b_t = await _running(store, make_new, advance, "b")
    end = FinishRequest(a, a_t, Status.SUCCESS, "ok", huge, side_effects=("k",), owner="w1")

    with pytest.raises(StoreRefused, match="packet limit"):
        await store.finish_many([end])
    with pytest.raises(StoreRefused, match="packet limit"):
        await store.finish(b, token=b_t, dst=Status.SUCCESS, reason="ok", result=huge)
    with pytest.raises(StoreRefused, match="packet limit"):
        await store.create_instance(replace(make_new("huge"), payload={"p": huge}))

    for instance_id in (a, b):
        row = await store.get_instance(instance_id)
        assert row is not None and row.status is Status.RUNNING
    assert await store.get_instance("inst-huge") is None
    assert not await store.side_effect_done("k")


async def test_creations_of_four_byte_text_filling_a_statement_are_all_written(
    store: SqlStore, make_new: MakeNew
) -> None:
    # Payloads of about 4 MB each (within `max_payload_bytes` at its largest), whose
    # characters add up to exactly one statement's budget.
    bare = [replace(make_new(f"wide{k}"), payload={"p": ""}) for k in range(ROWS)]
    base = max(sql_chunks.text_size(rows.instance_values(n)) for n in bare)
    news = [
        replace(n, payload={"p": EMOJI * (sql_chunks.STATEMENT_BYTES // ROWS - base)}) for n in bare
    ]

    results = await store.create_instances(news)

    assert [r.created for r in results] == [True] * ROWS
    for new in news:
        row = await store.get_instance(new.id)
        assert row is not None and row.payload == new.payload


@pytest.mark.parametrize("owner", ["w1", None], ids=["unread", "locking"])
async def test_finishes_of_four_byte_results_filling_a_statement_are_all_written(
    store: SqlStore, make_new: MakeNew, advance: Advance, owner: str | None
) -> None:
    runs = [await _running(store, make_new, advance, f"wide{k}") for k in range(ROWS)]
    # Results of about 4 MB each (within the executor's `MAX_RESULT_BYTES`), whose
    # characters add up to exactly one statement's budget; through the unread path (the
    # runs name their owner) and the locking path alike.
    bare = finishes.prepare_finish(FinishRequest("x", 1, Status.SUCCESS, "ok", result=""))
    n = sql_chunks.STATEMENT_BYTES // ROWS - sql_chunks.text_size(bare.values)
    # Each result its own (equal results would be one value in the UPDATE, not one each).
    results_of = {i: chr(ord(EMOJI) + k) * n for k, (i, _) in enumerate(runs)}
    requests = [
        FinishRequest(i, t, Status.SUCCESS, "ok", results_of[i], owner=owner) for i, t in runs
    ]

    results = await store.finish_many(requests)

    assert results == {i: CasResult(ok=True) for i, _ in runs}
    for instance_id, _ in runs:
        row = await store.get_instance(instance_id)
        assert row is not None and (row.status, row.result) == (
            Status.SUCCESS,
            results_of[instance_id],
        )
