"""Processes of the hammer runs: the arrival-logging upstream and the hammer processes.

Every process is started in its own session from the repository root, with its stderr in a
file under the test's log directory; leaving `spawn` kills its process group and reaps it.
Waits are bounded: a process that does not answer in time fails the test with its last
stderr lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fault.conftest import Cluster
from tests.support.arrivals import read_log
from tests.support.hammer import HammerConfig

ROOT = Path(__file__).resolve().parents[2]
READY_S = 60.0
"""Bound on a process connecting and saying it is ready (imports on a busy 2-core box)."""
END_GRACE_S = 45.0
"""Bound on a hammer process reporting after its run time is up."""


@dataclass
class Proc:
    """One child process speaking JSON lines on stdout."""

    name: str
    proc: asyncio.subprocess.Process
    log: Path

    async def line(self, timeout_s: float) -> dict[str, Any]:
        """The next stdout line as JSON; fails with the process's stderr when none comes."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raw = b""
        if not raw:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            rc = self.proc.returncode
            raise AssertionError(f"{self.name} (rc={rc}) said nothing:\n  " + "\n  ".join(tail))
        found: dict[str, Any] = json.loads(raw)
        return found

    async def tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self) -> None:
        """Kill this process's group (its own session) and reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 10)


@asynccontextmanager
async def spawn(
    name: str, args: Sequence[str], env: Mapping[str, str], logs: Path
) -> AsyncIterator[Proc]:
    """`python -m <args>` as `name`; killed when the block is left."""
    log = logs / f"{name}.err"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *args,
            cwd=ROOT,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    started = Proc(name, proc, log)
    try:
        yield started
    finally:
        await started.stop()


@dataclass(frozen=True)
class Upstream:
    """The arrival-logging upstream: where it listens and where its log is."""

    url: str
    log: Path


@asynccontextmanager
async def arrivals_upstream(env: Mapping[str, str], logs: Path) -> AsyncIterator[Upstream]:
    """`tests.support.arrivals` in its own process (unskewed), stopped when the block ends."""
    path = logs / "arrivals.log"
    async with spawn("upstream", ["tests.support.arrivals", str(path)], env, logs) as proc:
        port = int((await proc.line(READY_S))["port"])
        yield Upstream(f"http://127.0.0.1:{port}/call", path)


@dataclass(frozen=True)
class Member:
    """One hammer process: its name and its extra environment (e.g. a clock skew)."""

    name: str
    env: Mapping[str, str]
    skew_s: int = 0


@dataclass(frozen=True)
class Report:
    """What one hammer process did; `wall_offset_s` is how far its `time.time()` was from
    ours, measured against the monotonic clock both share."""

    member: Member
    wall_offset_s: float
    calls: int
    deferred: int
    errors: list[str]


def _wall_offset_s(ready: Mapping[str, Any]) -> float:
    ours = time.time() - time.monotonic()
    return float(ready["wall_s"]) - float(ready["mono_s"]) - ours


async def hammer(
    cfg: HammerConfig, crowd: Sequence[Member], env: Mapping[str, str], logs: Path
) -> list[Report]:
    """Start every member, wait until all are ready, start them together, collect reports."""
    arg = cfg.model_dump_json()
    async with AsyncExitStack() as stack:
        procs = [
            await stack.enter_async_context(
                spawn(m.name, ["tests.support.hammer", arg], {**env, **m.env}, logs)
            )
            for m in crowd
        ]
        readies = await asyncio.gather(*(p.line(READY_S) for p in procs))
        for proc in procs:
            await proc.tell("go")
        ends = await asyncio.gather(*(p.line(cfg.seconds + END_GRACE_S) for p in procs))
    return [
        Report(m, _wall_offset_s(ready), int(end["calls"]), int(end["deferred"]), end["errors"])
        for m, ready, end in zip(crowd, readies, ends, strict=True)
    ]


async def hammer_upstream(
    cluster: Cluster,
    crowd: Sequence[Member],
    *,
    limit: int,
    window_s: float,
    callers: int,
    seconds: float,
) -> tuple[list[Report], list[float]]:
    """Store the upstream `api`'s limit, run `crowd` against an arrival-logging upstream for
    `seconds`, and return the processes' reports and the upstream's arrival times."""
    await cluster.store.upsert_upstreams({"api": {"limit": limit, "window": window_s}})
    async with arrivals_upstream(cluster.env, cluster.logs) as upstream:
        cfg = HammerConfig(
            redis_url=cluster.env["TASKSTREAM_REDIS_URL"],
            database_url=cluster.env["TASKSTREAM_DATABASE_URL"],
            namespace=cluster.namespace,
            key_prefix=cluster.keys.prefix,
            url=upstream.url,
            upstream="api",
            callers=callers,
            seconds=seconds,
        )
        reports = await hammer(cfg, crowd, cluster.env, cluster.logs)
    return reports, read_log(upstream.log)
