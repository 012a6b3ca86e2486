"""Batches against their parts: `finish_many` over random runs leaves the same results, rows,
history and side-effect keys as sequential `finish` calls, and claims, lease extensions and
finishes each send a number of statements that does not grow with the batch."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from sqlalchemy import select

from taskstream.core.states import FailClass, Status
from taskstream.core.store.port import ClaimRequest, FinishRequest, InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.core.store.tables import side_effects
from tests.contract.store_batch_cases import T0_MS, _record_key, _seed
from tests.support.statements import statements

# finish_many == sequential finish


def _plan(rng: random.Random, size: int) -> list[tuple[str, str, FinishRequest]]:
    """Random runs, shuffled: (kind of row, its lease owner, the finish request), with ids
    and side-effect keys (from a small pool, some repeated) still to be tagged per twin set."""
    plan = []
    for n in range(size):
        kind = rng.choice(["held", "held", "held", "stale", "waiting", "missing"])
        dst = rng.choice([Status.SUCCESS, Status.FAILED, Status.RETRYING, Status.TIMEOUT])
        keys = rng.sample(["k0", "k1", "k2", "k3", "k4", "old"], rng.randint(0, 2))
        request = FinishRequest(
            str(n),
            rng.choice([1, 3]) if kind == "stale" else 2,
            dst,
            f"reason {n}",
            result=rng.choice([None, {"n": n}, [n, "x"]]),
            fail_class=rng.choice(list(FailClass)) if dst is Status.FAILED else None,
            error=rng.choice([None, f"error {n}"]),
            next_attempt_at_ms=T0_MS + n if dst is Status.RETRYING else None,
            side_effects=(*keys, *keys[:1]),
        )
        plan.append((kind, rng.choice(["exec-1", "exec-2"]), request))
    rng.shuffle(plan)
    return plan


async def _apply_plan(
    store: SqlStore, plan: list[tuple[str, str, FinishRequest]], tag: str
) -> list[FinishRequest]:
    """Seed one twin set (rows at attempt 2, the key "old" recorded); its tagged requests."""
    for kind, owner, r in plan:
        if kind in ("held", "stale"):
            await _seed(store, [tag + r.instance_id], status=Status.RUNNING, attempt=2, owner=owner)
        elif kind == "waiting":
            await _seed(store, [tag + r.instance_id], attempt=2)
    await _record_key(store, f"{tag}old")
    return [
        dataclasses.replace(
            r,
            instance_id=f"inst-{tag}{r.instance_id}",
            side_effects=tuple(tag + k for k in r.side_effects),
        )
        for _, _, r in plan
    ]


async def _outcome(store: SqlStore, tag: str, size: int) -> list[Any]:
    """Every row, history and side effect of one twin set, with the set's tag removed."""
    seen: list[Any] = []
    for n in range(size):
        row: InstanceRow | None = await store.get_instance(f"inst-{tag}{n}")
        if row is not None:
            row = dataclasses.replace(row, id="", dedupe_key="", updated_at_ms=0)
        history = [
            (h.from_status, h.to_status, h.attempt, h.owner, h.reason)
            for h in await store.history(f"inst-{tag}{n}")
        ]
        seen.append((n, row, history))
    key = side_effects.c.idempotency_key
    stmt = select(key, side_effects.c.instance_id, side_effects.c.attempt)
    async with store.engine.connect() as conn:
        rows = (await conn.execute(stmt.where(key.like(f"{tag}%")))).all()
    prefix = f"inst-{tag}"
    seen.append(sorted((k.removeprefix(tag), i.removeprefix(prefix), a) for k, i, a in rows))
    return seen


async def test_finish_many_equals_sequential_finish(store: SqlStore) -> None:
    size = 14
    for seed in (1, 2, 3):
        plan = _plan(random.Random(seed), size)
        batch_tag, single_tag = f"A{seed}-", f"B{seed}-"
        batch = await _apply_plan(store, plan, batch_tag)
        single = await _apply_plan(store, plan, single_tag)

        results = await store.finish_many(batch)
        expected = {}
        for r in single:
            expected[r.instance_id] = await store.finish(
                r.instance_id,
                token=r.token,
                dst=r.dst,
                reason=r.reason,
                result=r.result,
                fail_class=r.fail_class,
                error=r.error,
                next_attempt_at_ms=r.next_attempt_at_ms,
                side_effects=list(r.side_effects),
            )

        assert [(i.removeprefix(f"inst-{batch_tag}"), c) for i, c in results.items()] == [
            (i.removeprefix(f"inst-{single_tag}"), c) for i, c in expected.items()
        ]
        assert any(c.ok for c in results.values())
        assert not all(c.ok for c in results.values())
        assert await _outcome(store, batch_tag, size) == await _outcome(store, single_tag, size)


# statements per batch


async def test_batches_send_a_constant_number_of_statements(store: SqlStore) -> None:
    counts = []
    for size in (3, 40):
        ids = await _seed(store, (f"s{size}-{n:02d}" for n in range(size)))
        await store.claim_many([ClaimRequest(ids[0], 0, 30)], owner="warm-up")

        with statements(store) as claims:
            claimed = await store.claim_many([ClaimRequest(i, 0, 30) for i in ids], owner="x")
        with statements(store) as leases:
            held = await store.extend_leases([(i, c.token) for i, c in claimed.items()], lease_s=60)
        finishing = [
            FinishRequest(i, 1, Status.SUCCESS, "ok", {"i": i}, side_effects=(i,)) for i in ids
        ]
        with statements(store) as finishes:
            results = await store.finish_many(finishing)

        assert (len(claimed), len(held)) == (size - 1, size - 1)
        assert all(c.ok for c in results.values())
        counts.append((len(claims), len(leases), len(finishes)))

    # claims: lock and read, update, history; leases: lock, update;
    # finishes: lock, key check, update, history, side effects.
    assert counts == [(3, 2, 5), (3, 2, 5)]
