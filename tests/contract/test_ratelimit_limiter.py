"""The `Limiter` contract, run over the in-memory twin and Redis.

Windows are either long enough that a test runs inside one (60 s), or short (50-100 ms) with
the backend's clock moved past a computed moment by `Rig.wait_until_ms`, never by a sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from taskstream.core.errors import ConfigError
from taskstream.ratelimit.window import Admission
from tests.ratelimit.rigs import KINDS, Rig, open_rig

MINUTE_MS = 60_000


@pytest.fixture(params=KINDS)
async def rig(request: pytest.FixtureRequest, redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    async with open_rig(request.param, redis_url, namespace) as opened:
        yield opened


async def _calls(rig: Rig, n: int, limit: int, window_ms: int, burst: int = 0) -> list[Admission]:
    return [await rig.limiter.acquire("api", limit, window_ms, burst) for _ in range(n)]


async def test_admits_up_to_the_limit_then_asks_to_wait_about_a_window(rig: Rig) -> None:
    got = await _calls(rig, 4, limit=3, window_ms=MINUTE_MS)
    assert [a.allowed for a in got] == [True, True, True, False]
    assert [a.in_window for a in got] == [1, 2, 3, 3]
    assert [a.retry_after_ms for a in got[:3]] == [0, 0, 0]
    assert MINUTE_MS - 5_000 < got[3].retry_after_ms <= MINUTE_MS


async def test_rejected_calls_are_not_counted(rig: Rig) -> None:
    await _calls(rig, 10, limit=2, window_ms=MINUTE_MS)
    again = await rig.limiter.acquire("api", 5, MINUTE_MS)
    assert again == Admission(allowed=True, retry_after_ms=0, in_window=3, member=again.member)
    assert again.member is not None


async def test_a_released_hit_frees_its_slot(rig: Rig) -> None:
    """A hit whose call will not be sent is given back; releasing it again changes nothing."""
    [taken] = await _calls(rig, 1, limit=1, window_ms=MINUTE_MS)
    assert taken.member is not None
    assert not (await rig.limiter.acquire("api", 1, MINUTE_MS)).allowed
    await rig.limiter.release("api", taken.member)
    await rig.limiter.release("api", taken.member)
    assert (await rig.limiter.acquire("api", 1, MINUTE_MS)).in_window == 1


async def test_names_are_limited_separately(rig: Rig) -> None:
    assert (await rig.limiter.acquire("a", 1, MINUTE_MS)).allowed
    assert (await rig.limiter.acquire("b", 1, MINUTE_MS)).allowed
    assert not (await rig.limiter.acquire("a", 1, MINUTE_MS)).allowed


async def test_calls_in_the_same_millisecond_each_count(rig: Rig) -> None:
    got = await asyncio.gather(*(rig.limiter.acquire("api", 100, MINUTE_MS) for _ in range(20)))
    assert all(a.allowed for a in got)
    assert sorted(a.in_window for a in got) == list(range(1, 21))


async def test_a_call_is_admitted_once_the_retry_after_has_passed(rig: Rig) -> None:
    await _calls(rig, 2, limit=2, window_ms=50)
    rejected = await rig.limiter.acquire("api", 2, 50)
    seen_at = await rig.now_ms()
    assert not rejected.allowed
    assert 0 < rejected.retry_after_ms <= 50
    await rig.wait_until_ms(seen_at + rejected.retry_after_ms)
    assert (await rig.limiter.acquire("api", 2, 50)).allowed


async def test_burst_is_headroom_paid_back_in_the_next_window(rig: Rig) -> None:
    first = await _calls(rig, 4, limit=2, window_ms=100, burst=1)
    assert [a.allowed for a in first] == [True, True, True, False]
    seen_at = await rig.now_ms()
    await rig.wait_until_ms(seen_at + first[3].retry_after_ms)
    second = await _calls(rig, 2, limit=2, window_ms=100, burst=1)
    # Four calls in two windows is the long cap: the burst used earlier is paid back now.
    assert [a.allowed for a in second] == [True, False]
    assert 0 < second[1].retry_after_ms <= 200


@pytest.mark.parametrize(("limit", "window_ms", "burst"), [(0, 1000, 0), (1, 0, 0), (1, 10, -1)])
async def test_out_of_range_limits_are_config_errors(
    rig: Rig, limit: int, window_ms: int, burst: int
) -> None:
    with pytest.raises(ConfigError):
        await rig.limiter.acquire("api", limit, window_ms, burst)


async def test_concurrent_callers_share_one_limit(rig: Rig) -> None:
    async def caller() -> list[bool]:
        return [(await rig.limiter.acquire("api", 20, MINUTE_MS)).allowed for _ in range(50)]

    results = await asyncio.gather(*(caller() for _ in range(4)))
    assert sum(sum(r) for r in results) == 20


async def test_a_restamped_hit_counts_from_when_its_call_was_sent(rig: Rig) -> None:
    """Admitted at t0 and sent 30 ms later: the hit leaves the 50 ms window at t0 + 80 ms,
    not t0 + 50 ms."""
    admitted = await rig.limiter.acquire("api", 1, 50)
    t0 = await rig.now_ms()
    assert admitted.allowed and admitted.member is not None
    await rig.wait_until_ms(t0 + 30)
    assert await rig.limiter.restamp("api", admitted.member, 50)
    sent = await rig.now_ms()

    refused = await rig.limiter.acquire("api", 1, 50)
    assert not refused.allowed and refused.member is None
    await rig.wait_until_ms(t0 + 52)
    still = await rig.limiter.acquire("api", 1, 50)
    if await rig.now_ms() < sent + 50:  # a slow Redis reply may already be past it
        assert not still.allowed
    await rig.wait_until_ms(sent + 51)
    assert (await rig.limiter.acquire("api", 1, 50)).allowed


async def test_a_hit_out_of_its_window_is_stale_and_does_not_move(rig: Rig) -> None:
    admitted = await rig.limiter.acquire("api", 1, 50)
    t0 = await rig.now_ms()
    assert admitted.member is not None
    await rig.wait_until_ms(t0 + 51)

    assert not await rig.limiter.restamp("api", admitted.member, 50)
    assert not await rig.limiter.restamp("api", "0:unknown", 50)
    assert (await rig.limiter.acquire("api", 1, 50)).allowed  # the stale hit did not move


async def test_a_stale_hit_is_forgotten(rig: Rig) -> None:
    """A stale hit's call is not sent: the hit goes, so it does not hold the long cap (2 per
    two windows here) against the calls sent after it."""
    admitted = await rig.limiter.acquire("api", 1, 200, burst=1)
    t0 = await rig.now_ms()
    assert admitted.member is not None
    await rig.wait_until_ms(t0 + 201)

    assert not await rig.limiter.restamp("api", admitted.member, 200)
    assert (await rig.limiter.usage("api", 200)).in_horizon == 0
    assert (await rig.limiter.acquire("api", 1, 200, burst=1)).allowed
    assert (await rig.limiter.acquire("api", 1, 200, burst=1)).allowed
