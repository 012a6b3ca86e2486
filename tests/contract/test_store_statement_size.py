"""Batches of large values are split into statements that fit the server's packet limit
(MariaDB's `max_allowed_packet`, 16 MiB by default) however their text is made: a statement
carries its values, at most 4 bytes per character (utf8mb4), and its own SQL around them.
Each row here fits on its own, so its batch must be written, never refused as a whole."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taskstream.core.states import Status
from taskstream.core.store import sql_finishes as finishes
from taskstream.core.store import sql_instances as rows
from taskstream.core.store import sql_queries as q
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


async def test_creations_of_four_byte_text_filling_a_statement_are_all_written(
    store: SqlStore, make_new: MakeNew
) -> None:
    # Payloads of about 4 MB each (within `max_payload_bytes` at its largest), whose
    # characters add up to exactly one statement's budget.
    bare = [replace(make_new(f"wide{k}"), payload={"p": ""}) for k in range(ROWS)]
    base = max(q.text_size(rows.instance_values(n)) for n in bare)
    news = [replace(n, payload={"p": EMOJI * (q.STATEMENT_BYTES // ROWS - base)}) for n in bare]

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
    n = q.STATEMENT_BYTES // ROWS - q.text_size(bare.values)
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
