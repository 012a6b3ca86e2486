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
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from taskstream.runtime.embedded import EmbeddedValkey
from tests.fault.conftest import Cluster, Role
from tests.support import netns
from tests.support.forwarder import Forwarder
from tests.support.netns import Host

REDIS, DATABASE = "TASKSTREAM_REDIS_URL", "TASKSTREAM_DATABASE_URL"


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
