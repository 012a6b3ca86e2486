"""The upstream-aware HTTP client over the executor's gate on real Redis, calling a real
server on 127.0.0.1: admission refusals, outcomes recorded per call, typed errors, a run's
pre-admitted slot, no secret in any log or error, and bodies decoded within their cap."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from taskstream.agents.errors import UpstreamDeferred, UpstreamRejected, UpstreamUnavailable
from taskstream.agents.upstream import (
    GUARD_DOWN_WAIT_MS,
    STALE_WAIT_MS,
    UpstreamClient,
)
from taskstream.agents.upstream_access import CallTicket
from taskstream.core import streams
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.backend import GuardUnavailable
from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.ratelimit.window import guard_ms
from tests.ratelimit.rigs import RedisRig
from tests.support.databases import temp_database
from tests.support.loopback import Loopback, Reply, closed_port

SECRET = "sk-live-do-not-leak"


@pytest.fixture
async def db_url() -> AsyncIterator[str]:
    """The store only supplies the limits here: SQLite is enough."""
    async with temp_database("sqlite") as url:
        yield url


@pytest.fixture
async def limits(store: SqlStore) -> SqlStore:
    await store.upsert_upstreams({"api": {"limit": 2, "window": 60.0, "burst": None}})
    return store


def make_gate(store: SqlStore, redis: streams.Redis, keys: Keys, **breaker: Any) -> UpstreamGate:
    cfg = BreakerConfig(**breaker) if breaker else None
    return UpstreamGate(store, RedisLimiter(redis, keys), RedisBreakers(redis, keys), cfg)


async def breaker(redis: streams.Redis, keys: Keys, name: str = "api") -> BreakerState:
    return await RedisBreakers(redis, keys).state(name)


async def slots_used(redis: streams.Redis, keys: Keys, name: str = "api") -> int:
    return int(await redis.zcard(keys.limiter(name)))


async def test_a_full_limiter_refuses_before_sending(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    async with Loopback(Reply(200, b"ok")) as server:
        for _ in range(2):
            assert (await client.get(server.url("/x"), upstream="api")).status == 200
        with pytest.raises(UpstreamDeferred) as refused:
            await client.get(server.url("/x"), upstream="api")
        await client.aclose()
    assert refused.value.upstream == "api"
    assert 50_000 <= refused.value.retry_after_ms <= 60_000 + guard_ms(60_000)
    assert len(server.seen) == 2
    assert await slots_used(redis, keys) == 2


async def test_an_open_breaker_refuses_before_sending(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    gate = make_gate(limits, redis, keys, failure_threshold=1, cooldown_ms=60_000)
    client = UpstreamClient(gate.bind(()))
    async with Loopback(Reply(503)) as server:
        with pytest.raises(UpstreamUnavailable):
            await client.get(server.url(), upstream="api")
        assert (await breaker(redis, keys)).status is BreakerStatus.OPEN
        with pytest.raises(UpstreamDeferred) as refused:
            await client.get(server.url(), upstream="api")
        await client.aclose()
    assert 50_000 <= refused.value.retry_after_ms <= 60_000 + guard_ms(60_000)
    assert len(server.seen) == 1


@pytest.mark.parametrize(
    ("reply", "error", "calls", "failures"),
    [
        (Reply(200, b"fine"), None, 1, 0),
        (Reply(301, headers={"Location": "/elsewhere"}), None, 1, 0),
        (Reply(404), UpstreamRejected, 0, 0),
        (Reply(401), UpstreamRejected, 0, 0),
        (Reply(429, headers={"Retry-After": "7"}), UpstreamUnavailable, 1, 1),
        (Reply(500), UpstreamUnavailable, 1, 1),
        (Reply(503), UpstreamUnavailable, 1, 1),
    ],
)
async def test_each_call_is_recorded_once_by_its_status(
    limits: SqlStore,
    redis: streams.Redis,
    keys: Keys,
    reply: Reply,
    error: type[Exception] | None,
    calls: int,
    failures: int,
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    async with Loopback(reply) as server:
        if error is None:
            assert (await client.get(server.url(), upstream="api")).status == reply.status
        else:
            with pytest.raises(error) as caught:
                await client.get(server.url(), upstream="api")
            assert getattr(caught.value, "status", None) == reply.status
        await client.aclose()
    state = await breaker(redis, keys)
    assert (state.window_calls, state.window_failures) == (calls, failures)
    if reply.status == 429:
        assert getattr(caught.value, "retry_after_ms", None) == 7_000


async def test_a_half_open_probe_refused_by_the_limiter_is_handed_back(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    await limits.upsert_upstreams({"api": {"limit": 1, "window": 60.0, "burst": None}})
    gate = make_gate(limits, redis, keys, failure_threshold=1, cooldown_ms=1, probes=1)
    client = UpstreamClient(gate.bind(()))
    async with Loopback(Reply(503)) as server:
        with pytest.raises(UpstreamUnavailable):
            await client.get(server.url(), upstream="api")
        await client.aclose()
    opened = await breaker(redis, keys)
    assert opened.status is BreakerStatus.OPEN
    await RedisRig(redis, keys).wait_until_ms(opened.since_ms + 1)
    assert (await gate.admit_call("api"))[0] is not None  # a probe goes by; the window is full
    state = await breaker(redis, keys)
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)


async def test_a_probe_taken_for_one_upstream_is_handed_back_when_the_next_refuses(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """A run declares `api` (half-open) and `full` (no slot left): `api`'s probe, taken
    first, is given back, so `api` is not refused for a probe that never went out."""
    await limits.upsert_upstreams(
        {
            "api": {"limit": 2, "window": 60.0, "burst": None},
            "full": {"limit": 1, "window": 60.0, "burst": None},
        }
    )
    gate = make_gate(limits, redis, keys, failure_threshold=1, cooldown_ms=1, probes=1)
    assert await gate.record_call("api", Outcome.FAILURE, probe_round=None) is not None
    opened = await breaker(redis, keys)
    assert opened.status is BreakerStatus.OPEN
    await RedisRig(redis, keys).wait_until_ms(opened.since_ms + 1)
    assert (await gate.admit_call("full"))[0] is None  # takes `full`'s only slot
    assert isinstance(await gate.admit_run(["api", "full"]), int)
    state = await breaker(redis, keys)
    assert (state.status, state.probes_admitted) == (BreakerStatus.HALF_OPEN, 0)
    assert (await gate.admit_call("api"))[0] is None  # the probe is there to take


async def test_check_false_returns_error_responses_but_still_records_them(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    async with Loopback(Reply(503, b"down")) as server:
        response = await client.get(server.url(), upstream="api", check=False)
        await client.aclose()
    assert (response.status, response.text) == (503, "down")
    assert (await breaker(redis, keys)).window_failures == 1


async def test_a_timeout_is_retriable_and_a_breaker_failure(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()), timeout_s=0.2)
    async with Loopback(Reply(200, hold=asyncio.Event())) as server:
        with pytest.raises(UpstreamUnavailable, match=r"timed out after 0\.2 s") as caught:
            await client.get(server.url("/slow"), upstream="api")
        await client.aclose()
    assert caught.value.status is None
    assert (await breaker(redis, keys)).window_failures == 1
    assert await slots_used(redis, keys) == 1, "the request went out: its slot is spent"


async def test_a_refused_connection_is_retriable_and_a_breaker_failure(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """No connection, so no request reached the upstream: its window slot is given back,
    while the breaker counts the failure."""
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    for _ in range(3):  # more than the limit of 2: each slot came back
        with pytest.raises(UpstreamUnavailable, match="ConnectError"):
            await client.get(f"http://127.0.0.1:{closed_port()}/", upstream="api")
    await client.aclose()
    assert (await breaker(redis, keys)).window_failures == 3
    assert await slots_used(redis, keys) == 0


async def test_a_request_that_cannot_be_sent_is_fatal_and_ignored_by_the_breaker(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    with pytest.raises(UpstreamRejected, match="could not be sent"):
        await client.get("gopher://127.0.0.1/", upstream="api")
    await client.aclose()
    state = await breaker(redis, keys)
    assert (state.window_calls, state.window_failures) == (0, 0)
    assert await slots_used(redis, keys) == 0


@pytest.mark.parametrize("url", ["http://[::1/x", f"http://svc:{SECRET}/x@127.0.0.1:1/"])
async def test_a_url_that_cannot_be_read_is_fatal_ignored_and_never_shown(
    limits: SqlStore, redis: streams.Redis, keys: Keys, url: str
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    with capture_logs() as logs, pytest.raises(UpstreamRejected) as caught:
        await client.get(url, upstream="api")
    await client.aclose()
    assert (
        str(caught.value)
        == "GET http://<unparseable URL> (upstream 'api') could not be sent: InvalidURL"
    )
    assert "do-not-leak" not in repr(logs)
    state = await breaker(redis, keys)
    assert (state.window_calls, state.window_failures) == (0, 0)


async def test_the_first_call_uses_the_runs_admission_and_later_ones_acquire(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    gate = make_gate(limits, redis, keys)
    access = await gate.admit_run(["api"])  # the run-level admission: 1 of 2 slots
    assert not isinstance(access, int)
    client = UpstreamClient(access)
    async with Loopback(Reply(200)) as server:
        await client.get(server.url(), upstream="api")
        assert await slots_used(redis, keys) == 1
        await client.get(server.url(), upstream="api")
        assert await slots_used(redis, keys) == 2
        with pytest.raises(UpstreamDeferred):
            await client.get(server.url(), upstream="api")
        await client.aclose()
    await access.settle(Outcome.SUCCESS)
    assert (await breaker(redis, keys)).window_calls == 2  # the two calls, not the run again


async def test_settle_records_unused_upstreams_and_interrupted_calls(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    gate = make_gate(limits, redis, keys)
    access = await gate.admit_run(["api", "other"])
    assert not isinstance(access, int)
    client = UpstreamClient(access)
    async with Loopback(Reply(200, hold=asyncio.Event())) as server:
        call = asyncio.create_task(client.get(server.url(), upstream="api"))
        await asyncio.wait_for(server.arrived.wait(), timeout=10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await client.aclose()
    assert (await breaker(redis, keys)).window_calls == 0
    await access.settle(Outcome.FAILURE)
    assert (await breaker(redis, keys, "api")).window_failures == 1
    assert (await breaker(redis, keys, "other")).window_failures == 1


async def test_no_secret_reaches_logs_or_errors(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    headers = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET}
    texts: list[str] = []

    async def attempt(url: str, **kwargs: Any) -> None:
        try:
            await client.get(url, upstream="api", headers=headers, **kwargs)
        except Exception as exc:
            texts.extend([str(exc), repr(exc)])

    await limits.upsert_upstreams({"api": {"limit": 100, "window": 60.0, "burst": None}})
    seen = []
    with capture_logs() as logs:
        client = UpstreamClient(make_gate(limits, redis, keys).bind(()), timeout_s=0.2)
        for reply in (Reply(401), Reply(503), Reply(200), Reply(200, hold=asyncio.Event())):
            async with Loopback(reply) as server:
                await attempt(server.url(f"/p?token={SECRET}"))
            seen += server.seen
        await attempt(f"http://user:{SECRET}@127.0.0.1:{closed_port()}/?key={SECRET}")
        await client.aclose()
    assert [x.headers["authorization"] for x in seen] == [f"Bearer {SECRET}"] * 4  # all sent
    assert len(texts) == 8 and len(logs) == 5
    assert {entry["event"] for entry in logs} >= {"upstream.call", "upstream.call_failed"}
    assert not [text for text in texts if SECRET in text]
    assert not [entry for entry in logs if SECRET in repr(entry)]


class DownGuard:
    """An `UpstreamAccess` whose Redis cannot be reached (for `acquire` when `admits` is
    False; always for `record`)."""

    def __init__(self, admits: bool) -> None:
        self.admits = admits

    async def acquire(self, name: str) -> CallTicket | int:
        if not self.admits:
            raise GuardUnavailable("redis down")
        return CallTicket(name)

    async def record(self, ticket: CallTicket, outcome: Outcome, *, sent: bool = True) -> None:
        raise GuardUnavailable("redis down")

    async def sending(self, ticket: CallTicket) -> bool:
        return True


async def _deferred_unsent(client: UpstreamClient) -> int:
    """The wait (ms) of the `UpstreamDeferred` one call raises; fails if it reached the
    server."""
    async with Loopback(Reply(200)) as server:
        with pytest.raises(UpstreamDeferred) as deferred:
            await client.get(server.url(), upstream="api")
        await client.aclose()
    assert server.seen == []
    return deferred.value.retry_after_ms


async def test_an_unreachable_guard_defers_the_call() -> None:
    assert await _deferred_unsent(UpstreamClient(DownGuard(admits=False))) == GUARD_DOWN_WAIT_MS


async def test_a_lost_breaker_record_keeps_the_calls_result() -> None:
    client = UpstreamClient(DownGuard(admits=True))
    async with Loopback(Reply(200, b"done")) as server:
        assert (await client.get(server.url(), upstream="api")).text == "done"
        with pytest.raises(UpstreamRejected):
            await client.get(server.url("/missing"), upstream="api", headers={"x": "\n"})
        await client.aclose()


async def _only_hit(redis: streams.Redis, keys: Keys) -> tuple[str, int]:
    found: list[Any] = await redis.zrange(keys.limiter("api"), 0, -1, withscores=True)
    [(member, score)] = found
    return streams.as_text(member), int(score)


async def _redis_now_ms(redis: streams.Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _admitted_ago(
    limits: SqlStore, redis: streams.Redis, keys: Keys, ago_ms: int
) -> tuple[RunUpstreams, str]:
    """A run's own admission to `api`, its window hit moved `ago_ms` back (its agent worked
    that long before its first call); with the hit's member."""
    access = await make_gate(limits, redis, keys).admit_run(["api"])
    assert not isinstance(access, int)
    member, admitted_at = await _only_hit(redis, keys)
    await redis.zadd(keys.limiter("api"), {member: admitted_at - ago_ms})
    return access, member


async def _one_call_sent(access: RunUpstreams) -> bool:
    """One call to `api` through `access`: whether it reached the server."""
    client = UpstreamClient(access)
    async with Loopback(Reply(200)) as server:
        await client.get(server.url(), upstream="api")
    await client.aclose()
    return len(server.seen) == 1


async def test_a_runs_admission_counts_from_when_its_first_call_is_sent(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The run is admitted before its agent starts; an agent that works 20 s before its
    first call would otherwise have that call counted 20 s before it reached the upstream."""
    access, member = await _admitted_ago(limits, redis, keys, 20_000)  # the agent's 20 s
    before = await _redis_now_ms(redis)
    assert await _one_call_sent(access)
    assert (await _only_hit(redis, keys))[0] == member
    assert (await _only_hit(redis, keys))[1] >= before


async def test_a_runs_admission_that_went_stale_before_its_first_call_is_taken_anew(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The agent worked more than a window (61.2 s, guard included) before its first call:
    the run's admission can no longer move to the send time (its slot may have been given
    again). The call takes a slot anew and goes out, instead of the run being deferred to
    do the same work again, and again."""
    access, member = await _admitted_ago(limits, redis, keys, 62_000)
    before = await _redis_now_ms(redis)
    assert await _one_call_sent(access)
    found: list[Any] = await redis.zrange(keys.limiter("api"), 0, -1, withscores=True)
    fresh = [int(score) for m, score in found if streams.as_text(m) != member]
    assert len(fresh) == 1 and fresh[0] >= before


async def test_a_runs_admission_that_went_stale_is_deferred_when_the_window_is_full(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    access, _ = await _admitted_ago(limits, redis, keys, 62_000)
    assert (await make_gate(limits, redis, keys).admit_call("api"))[0] is None
    assert (await make_gate(limits, redis, keys).admit_call("api"))[0] is None  # now full
    assert 50_000 <= await _deferred_unsent(UpstreamClient(access)) <= 61_200


class StaleAtSend:
    """An `UpstreamAccess` whose admission goes stale before the request is sent (a
    connection that took longer than the window to set up)."""

    async def acquire(self, name: str) -> CallTicket | int:
        return CallTicket(name, hit="1-1")

    async def record(self, ticket: CallTicket, outcome: Outcome, *, sent: bool = True) -> None:
        raise AssertionError("a call never sent is not recorded")

    async def sending(self, ticket: CallTicket) -> bool:
        return False


async def test_a_call_whose_admission_went_stale_before_sending_is_not_sent() -> None:
    assert await _deferred_unsent(UpstreamClient(StaleAtSend())) == STALE_WAIT_MS


async def test_a_runs_admission_is_not_sent_into_a_breaker_opened_since(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The run was admitted while `api`'s breaker was closed; other runs' failures opened it
    (60 s cool-down) before the agent's first call. That call is deferred until the
    cool-down ends, not sent into the outage, and the run's window slot is given back."""
    gate = make_gate(limits, redis, keys, failure_threshold=1, cooldown_ms=60_000)
    access = await gate.admit_run(["api"])
    assert not isinstance(access, int)
    assert await gate.record_call("api", Outcome.FAILURE, probe_round=None) is not None
    assert (await breaker(redis, keys)).status is BreakerStatus.OPEN
    assert 59_000 <= await _deferred_unsent(UpstreamClient(access)) <= 60_000
    assert await slots_used(redis, keys) == 0


def gzip_bomb(expanded: int, layers: int) -> bytes:
    """`expanded` zero bytes (a multiple of 1 MiB) gzipped `layers` times; the first layer is
    fed in 1 MiB blocks so that building it never holds the expanded body."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1024 * 1024)
    body = b"".join(
        [*(packer.compress(block) for _ in range(expanded // len(block))), packer.flush()]
    )
    for _ in range(layers - 1):
        body = gzip.compress(body, 9)
    return body


async def test_a_compressed_body_costs_memory_by_the_cap_not_by_its_expanded_size() -> None:
    cap = 64 * 1024
    body = gzip_bomb(64 * 1024 * 1024, layers=2)
    assert len(body) < cap  # what travels is under the cap
    reply = Reply(200, body, {"Content-Encoding": "gzip, gzip", "Content-Type": "text/plain"})
    client = UpstreamClient()
    async with Loopback(reply) as server:
        tracemalloc.start()
        try:
            response = await client.get(server.url(), max_body_bytes=cap)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await client.aclose()
    assert response.truncated and response.content == bytes(cap)
    assert peak < 16 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB for a {cap // 1024} KiB cap"


def _deflate(data: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return packer.compress(data) + packer.flush()


TEXT = b"hello, " * 3000


@pytest.mark.parametrize(
    ("coding", "sent", "content"),
    [
        ("gzip", gzip.compress(TEXT), TEXT),
        ("gzip, gzip", gzip.compress(gzip.compress(TEXT)), TEXT),
        ("deflate", _deflate(TEXT, zlib.MAX_WBITS), TEXT),
        ("deflate", _deflate(TEXT, -zlib.MAX_WBITS), TEXT),  # raw deflate, as some servers send
        ("identity", TEXT, TEXT),
        ("br", TEXT, TEXT),  # not decodable with a bound: kept as sent
    ],
    ids=["gzip", "gzip-twice", "deflate", "raw-deflate", "identity", "br"],
)
async def test_bodies_are_decoded_from_gzip_and_deflate_and_else_kept_as_sent(
    coding: str, sent: bytes, content: bytes
) -> None:
    client = UpstreamClient()
    async with Loopback(Reply(200, sent, {"Content-Encoding": coding})) as server:
        whole = await client.get(server.url())
        capped = await client.get(server.url(), max_body_bytes=100)
        await client.aclose()
    assert (whole.content, whole.truncated) == (content, False)
    assert (capped.content, capped.truncated) == (content[:100], True)
    assert server.seen[0].headers["accept-encoding"] == "gzip, deflate"


async def test_a_corrupt_compressed_body_is_retriable_and_a_callers_accept_encoding_is_sent(
    limits: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    client = UpstreamClient(make_gate(limits, redis, keys).bind(()))
    reply = Reply(200, b"not gzip at all", {"Content-Encoding": "gzip"})
    async with Loopback(reply) as server:
        with pytest.raises(UpstreamUnavailable, match="DecodingError"):
            await client.get(server.url(), upstream="api", headers={"accept-encoding": "gzip"})
        await client.aclose()
    assert server.seen[0].headers["accept-encoding"] == "gzip"
    assert (await breaker(redis, keys)).window_failures == 1
