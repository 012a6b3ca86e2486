"""The hosts, servers and forwarders of the partition tests (Linux network namespaces, root
only).

Each "host" is a namespace joined to the root namespace (the core host: Redis, the database,
the sweeper) by a veth pair (`tests.support.netns`). Redis is a Valkey server of the test's
own, bound to loopback and to the root side of each link; the database is reached through a
forwarder in the test process listening there: one for every host (`database_forwarder`), or
one per host (`database_forwarders`, `redis_forwarders`), to cut one host off from the
database or from Redis alone (`Forwarder.blackhole`).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from taskstream.core.states import Status
from taskstream.core.store.records import HistoryRow
from taskstream.runtime.embedded import EmbeddedValkey
from tests.fault.conftest import Cluster, Role, rows_to, running_rows
from tests.support import netns
from tests.support.forwarder import Forwarder
from tests.support.netns import Host

REDIS, DATABASE = "TASKSTREAM_REDIS_URL", "TASKSTREAM_DATABASE_URL"
MARKS = [
    pytest.mark.fault,
    pytest.mark.skipif(netns.unavailable() is not None, reason=str(netns.unavailable())),
]
"""Every partition test's marks (`pytestmark`): a fault run, as root with `ip` only."""


@pytest.fixture
def two_hosts() -> Iterator[list[Host]]:
    with netns.hosts(2) as made:
        yield made


@pytest.fixture
def roles_redis_url(tmp_path: Path, two_hosts: list[Host]) -> Iterator[str]:
    """A Valkey server of this test's own, on loopback and on the root side of each link."""
    bind = " ".join(["127.0.0.1", *(h.root_addr for h in two_hosts)])
    with EmbeddedValkey(tmp_path / "valkey", extra_config=[f"bind {bind}"]) as url:
        yield url


@pytest.fixture
async def database_forwarder(cluster: Cluster, two_hosts: list[Host]) -> AsyncIterator[int]:
    """The port, on the root side of each link, that leads to the cluster's database."""
    db = make_url(cluster.env[DATABASE])
    listen = [(h.root_addr, 0) for h in two_hosts]
    async with Forwarder(listen, (db.host or "127.0.0.1", db.port or 3306)) as fwd:
        yield fwd.port


@pytest.fixture
async def redis_forwarders(
    cluster: Cluster, two_hosts: list[Host]
) -> AsyncIterator[dict[str, Forwarder]]:
    """By host (namespace name): a forwarder to Redis of its own on the root side of its link,
    to cut that host off from Redis alone."""
    redis = make_url(cluster.env[REDIS])
    async with _per_host(two_hosts, (redis.host or "127.0.0.1", redis.port or 6379)) as made:
        yield made


@pytest.fixture
async def database_forwarders(
    cluster: Cluster, two_hosts: list[Host]
) -> AsyncIterator[dict[str, Forwarder]]:
    """By host (namespace name): a forwarder to the database of its own on the root side of
    its link, to cut that host off from the database alone."""
    db = make_url(cluster.env[DATABASE])
    async with _per_host(two_hosts, (db.host or "127.0.0.1", db.port or 3306)) as made:
        yield made


@contextlib.asynccontextmanager
async def _per_host(
    hosts: list[Host], target: tuple[str, int]
) -> AsyncIterator[dict[str, Forwarder]]:
    async with contextlib.AsyncExitStack() as stack:
        made = {}
        for host in hosts:
            made[host.netns] = await stack.enter_async_context(
                Forwarder([(host.root_addr, 0)], target)
            )
        yield made


def start_on(
    cluster: Cluster, host: Host, db_port: int, role: str, redis_port: int | None = None
) -> Role:
    """Start a role inside `host`, reaching Redis (on `redis_port`, a forwarder's, when
    given) and the database over its link."""
    env = {
        REDIS: host.url(cluster.env[REDIS], redis_port),
        DATABASE: host.url(cluster.env[DATABASE], db_port),
    }
    return cluster.start(role, env, wrap=host.wrap)


def partition(host: Host, how: str) -> None:
    """`cut`: the host's link goes down; `drop`: it stays up and loses every packet."""
    host.cut() if how == "cut" else host.drop()


async def first_claim(cluster: Cluster, instance: str) -> tuple[Role, Role]:
    """(the executor whose run of `instance` was claimed first, the other executor)."""
    first = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 1, what="first run claimed"
    )
    victim = cluster.holder(running_rows(first)[0].owner)
    [survivor] = [r for r in cluster.executors() if r is not victim]
    return victim, survivor


async def taken_over(
    cluster: Cluster, instance: str, cut_ms: float, timeout_s: float = 30.0
) -> tuple[HistoryRow, int]:
    """The run of `instance` claimed again after the partition made at `cut_ms` (epoch ms),
    and how long after it (ms, on the database clock's `at_ms`)."""
    again = await cluster.history_until(
        instance, lambda h: len(running_rows(h)) == 2, timeout_s=timeout_s, what="run taken over"
    )
    rerun = running_rows(again)[1]
    return rerun, round(rerun.at_ms - cut_ms)


async def fenced(cluster: Cluster, victim: Role, instance: str, timeout_s: float) -> None:
    """Wait until `victim` logged its run of `instance` as fenced (its late commit refused)."""

    async def logged() -> bool:
        return bool(victim.logged("instance.fenced", instance_id=instance))

    await cluster.until(logged, timeout_s=timeout_s, what="late commit fenced")


async def assert_taken_over(
    cluster: Cluster, instance: str, victim: Role, survivor: Role, timed_out_as: str
) -> None:
    """`instance` ended with one SUCCESS, `survivor`'s at attempt 2, after `victim`'s run was
    timed out as `timed_out_as`; `victim` committed no end of it."""
    history = await cluster.store.history(instance)
    [success] = rows_to(history, Status.SUCCESS)
    assert (success.owner, success.attempt) == (survivor.consumer, 2)
    assert [h.reason for h in rows_to(history, Status.TIMEOUT)] == [timed_out_as]
    assert committed_none_of(victim, instance)


def committed_none_of(victim: Role, instance: str) -> bool:
    """`victim` committed no end of any run of `instance`, alone or in a batch."""
    batches = victim.logged("instances.committed")
    in_batch = [r for b in batches for r in b["runs"] if r.startswith(f"{instance}@")]
    return not in_batch and not victim.logged("instance.committed", instance_id=instance)


async def serves_alone(cluster: Cluster, victim: Role, survivor: Role) -> str:
    """Stop `survivor`, then run one `quick` instance: it must be `victim`'s. Its id."""
    survivor.send(signal.SIGTERM)
    await cluster.until(lambda: exited(survivor), timeout_s=30, what="survivor stopped")
    later = await cluster.emit("quick", 1)
    await cluster.reach(later, Status.SUCCESS, timeout_s=45)
    owners = [h.owner for h in running_rows(await cluster.store.history(later))]
    assert owners == [victim.consumer], owners
    return later


async def exited(role: Role) -> bool:
    """`role`'s process has ended (for `Cluster.until`)."""
    return not role.alive
