"""Fault fixtures: real role processes on real Redis and a fresh MariaDB database per test.

Each role is `python -m taskstream executor|sweeper|scheduler`, started in its own session
from the repository root (so `tests.agents` imports) with its output in a file under the
test's `tmp_path`. The environment carries only the cluster's URLs, the test's namespace,
`TASKSTREAM_AGENT_MODULES=tests.agents` and `TASKSTREAM_LOG_LEVEL=info`; every other setting
keeps its default unless a test says otherwise. Teardown kills every process it started,
deletes the Redis keys of the test's namespace (`ts:{<ns>}:*`, nothing else) and drops the
database.

Tests observe the cluster only through the store (instance rows, history) and Redis (stream
lengths, pending lists, the dead-letter stream), and wait for events with bounded polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis.exceptions import ResponseError

from taskstream.core import streams
from taskstream.core.definitions import to_records
from taskstream.core.outbox import Outbox
from taskstream.core.protocol import GROUP, Keys
from taskstream.core.spec import TaskSpec
from taskstream.core.specfile import parse_task_file_text
from taskstream.core.states import SETTLED, Status
from taskstream.core.store.port import HistoryRow, InstanceRow
from taskstream.core.store.sql import SqlStore
from taskstream.scheduler.service import new_instance
from tests.support.databases import temp_database

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
READY_S = 45.0
"""Bound on a role process becoming ready (imports and connections on a busy 2-core box)."""
POLL_S = 0.1
RecordProperty = Callable[[str, object], None]
"""The `record_property` fixture: adds a measured value to the test's report."""
STARTED_EVENT = {
    "executor": "executor.started",
    "sweeper": "sweeper.started",
    "scheduler": "scheduler.started",
}


class NotReached(AssertionError):
    """A condition a fault test waited for did not happen before its deadline."""


@dataclass
class Role:
    """One role process started by a test."""

    name: str
    role: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines the process has written so far (other lines are skipped)."""
        out: list[dict[str, Any]] = []
        for line in self.log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out

    def logged(self, event: str, **fields: object) -> list[dict[str, Any]]:
        """Log lines of `event` whose fields include `fields`."""
        return [
            e
            for e in self.events()
            if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
        ]

    @property
    def consumer(self) -> str:
        """The executor's consumer name (`host:pid:start`), from its start line."""
        started = self.logged("executor.started")
        if not started:
            raise NotReached(f"{self.name} has not logged executor.started")
        return str(started[0]["consumer"])

    @property
    def ready(self) -> bool:
        return bool(self.logged(STARTED_EVENT[self.role]))

    def send(self, sig: signal.Signals) -> None:
        """Send `sig` to this process only."""
        if self.alive:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group this test started (it is the process's own session) and
        reap it. A process already reaped is left alone, so its id is never reused by mistake."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 6) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n    ".join(text[-lines:])


def owner_pid(consumer: str) -> int:
    """The pid in a consumer name `host:pid:start`."""
    return int(consumer.rsplit(":", 2)[1])


def running_rows(history: list[HistoryRow]) -> list[HistoryRow]:
    return [h for h in history if h.to_status is Status.RUNNING]


def rows_to(history: list[HistoryRow], status: Status) -> list[HistoryRow]:
    return [h for h in history if h.to_status is status]


@dataclass
class Cluster:
    """The processes, store and Redis of one fault test."""

    namespace: str
    keys: Keys
    store: SqlStore
    redis: streams.Redis
    env: dict[str, str]
    logs: Path
    roles: list[Role] = field(default_factory=list)
    specs: dict[str, TaskSpec] = field(default_factory=dict)

    # processes

    def start(
        self,
        role: str,
        env: Mapping[str, str] | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> Role:
        """Start one role process (`executor`, `sweeper`, `scheduler`); `wrap` turns its
        command line into the one to run (`ip netns exec NS ...`: the same process id)."""
        name = f"{role}-{sum(r.role == role for r in self.roles) + 1}"
        log = self.logs / f"{name}.log"
        argv = [sys.executable, "-m", "taskstream", role]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                wrap(argv) if wrap is not None else argv,
                cwd=ROOT,
                env={**self.env, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = Role(name, role, proc, log)
        self.roles.append(started)
        return started

    async def ready(self, *roles: Role) -> None:
        """Wait until every given role (default: all live ones) has logged its start."""
        waiting = list(roles) or [r for r in self.roles if r.alive]

        async def check() -> bool:
            dead = [r.name for r in waiting if not r.alive]
            if dead:
                raise NotReached(f"exited before ready: {dead}\n{self.report()}")
            return all(r.ready for r in waiting)

        await self.until(check, timeout_s=READY_S, what="role processes ready")

    def executors(self, *, dead_too: bool = False) -> list[Role]:
        """The executor processes started so far that are running (or all of them)."""
        return [r for r in self.roles if r.role == "executor" and (dead_too or r.alive)]

    def holder(self, consumer: str | None) -> Role:
        """The executor process whose consumer name is `consumer`."""
        assert consumer is not None
        pid = owner_pid(consumer)
        found = [r for r in self.roles if r.role == "executor" and r.pid == pid]
        assert found, f"no executor started by this test has pid {pid} ({consumer})"
        return found[0]

    def stop_all(self) -> None:
        for role in self.roles:
            role.kill()

    def report(self) -> str:
        """Each process with its exit code and last log lines (for failure messages)."""
        return "\n".join(
            f"  {r.name} pid={r.pid} rc={r.proc.poll()}:\n    {r.tail()}" for r in self.roles
        )

    # waiting

    async def until(
        self,
        check: Callable[[], Awaitable[T | None]],
        *,
        timeout_s: float,
        what: str,
        tick: Callable[[], None] | None = None,
    ) -> T:
        """Poll `check` until it returns a truthy value and return it; `tick` runs before each
        poll. The deadline only bounds a broken run: tests never wait for time to pass."""
        deadline = time.monotonic() + timeout_s
        while True:
            if tick is not None:
                tick()
            found = await check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise NotReached(f"{what}: not reached within {timeout_s:g} s\n{self.report()}")
            await asyncio.sleep(POLL_S)

    async def reach(
        self,
        instance_id: str,
        *statuses: Status,
        timeout_s: float = 60.0,
        tick: Callable[[], None] | None = None,
    ) -> InstanceRow:
        """Wait until the instance is in one of `statuses`; returns the row."""
        return await self.row_until(
            instance_id,
            lambda row: row.status in statuses,
            timeout_s=timeout_s,
            what=f"{instance_id} in {[str(s) for s in statuses]}",
            tick=tick,
        )

    async def row_until(
        self,
        instance_id: str,
        done: Callable[[InstanceRow], bool],
        *,
        timeout_s: float = 60.0,
        what: str,
        tick: Callable[[], None] | None = None,
    ) -> InstanceRow:
        """Wait until the instance's row satisfies `done`; returns it."""

        async def check() -> InstanceRow | None:
            row = await self.store.get_instance(instance_id)
            return row if row is not None and done(row) else None

        return await self.until(check, timeout_s=timeout_s, what=what, tick=tick)

    async def history_until(
        self,
        instance_id: str,
        done: Callable[[list[HistoryRow]], bool],
        *,
        timeout_s: float = 60.0,
        what: str,
    ) -> list[HistoryRow]:
        """Wait until the instance's history satisfies `done`; returns it."""

        async def check() -> list[HistoryRow] | None:
            history = await self.store.history(instance_id)
            return history if done(history) else None

        return await self.until(check, timeout_s=timeout_s, what=what)

    # store

    async def apply(self, text: str) -> None:
        """Store the task definitions of a task file (agents are not checked here, so a task
        may name an agent no executor knows)."""
        taskfile = parse_task_file_text(text, "fault.yaml")
        await self.store.upsert_definitions(to_records(taskfile))
        self.specs.update({spec.id: spec for spec in taskfile.tasks})

    async def emit(self, task_id: str, offset_ms: int = 0) -> str:
        """Create and publish one instance of `task_id` through the outbox; returns its id.
        `offset_ms` makes the fire time (and so the dedupe key) distinct."""
        now_ms = await self.store.db_now_ms()
        outbox = Outbox(self.store, self.redis, self.keys)
        emitted = await outbox.emit(
            new_instance(self.specs[task_id], now_ms - 60_000 + offset_ms), now_ms=now_ms
        )
        assert emitted.outcome == "published", emitted
        return emitted.instance_id

    async def settled(self, instance_ids: list[str]) -> dict[str, InstanceRow]:
        """The rows of those instances that are settled (SUCCESS, FAILED, SKIPPED)."""
        out: dict[str, InstanceRow] = {}
        for instance_id in instance_ids:
            row = await self.store.get_instance(instance_id)
            if row is not None and row.status in SETTLED:
                out[instance_id] = row
        return out

    # redis

    async def backlog(self) -> tuple[int, int]:
        """(entries on the work streams, entries pending in the group) over every stream."""
        length = pending = 0
        for stream in self.keys.streams():
            length += int(await self.redis.xlen(stream))
            with contextlib.suppress(ResponseError):  # no group yet
                summary: Any = await self.redis.xpending(stream, GROUP)
                pending += int(summary["pending"])
        return length, pending

    async def drained(self, timeout_s: float = 45.0) -> None:
        """Wait until every work stream is empty with nothing pending."""

        async def check() -> bool:
            return await self.backlog() == (0, 0)

        await self.until(check, timeout_s=timeout_s, what="work streams drained")

    async def dead_letters(self) -> list[dict[str, str]]:
        """The dead-letter stream's entries as text fields, oldest first."""
        entries: Any = await self.redis.xrange(self.keys.dead)
        return [
            {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}
            for _, fields in entries
        ]

    async def delete_keys(self) -> None:
        """Delete this test's namespace keys only."""
        found = [k async for k in self.redis.scan_iter(match=f"{self.keys.base}:*", count=500)]
        if found:
            await self.redis.delete(*found)


def role_env(redis_url: str, database_url: str, namespace: str, home: Path) -> dict[str, str]:
    """The environment of every role process: ours minus any `TASKSTREAM_*` setting, plus the
    cluster's endpoints, the namespace and the test agents."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    path = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        PYTHONUNBUFFERED="1",
        TASKSTREAM_REDIS_URL=redis_url,
        TASKSTREAM_DATABASE_URL=database_url,
        TASKSTREAM_NAMESPACE=namespace,
        TASKSTREAM_AGENT_MODULES="tests.agents",
        TASKSTREAM_LOG_LEVEL="info",
        TASKSTREAM_HOME=str(home),
    )
    return env


@pytest.fixture
def roles_redis_url(redis_url: str) -> str:
    """The Redis the role processes use; a test module may override it with its own server."""
    return redis_url


@pytest.fixture
async def cluster(roles_redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """A fresh database and namespace; role processes are started by the test."""
    logs = tmp_path / "logs"
    logs.mkdir()
    keys = Keys(prefix="ts", namespace=namespace)
    async with temp_database("mariadb") as database_url:
        store = await SqlStore.connect(database_url)
        redis = streams.connect(roles_redis_url)
        env = role_env(roles_redis_url, database_url, namespace, tmp_path / "home")
        made = Cluster(namespace, keys, store, redis, env, logs)
        try:
            await streams.ensure_groups(redis, keys)
            yield made
        finally:
            made.stop_all()
            try:
                await made.delete_keys()
            finally:
                await redis.aclose()
                await store.close()
