"""`taskstream up`: its children and embedded Valkey live and die with it, a run that outlives
the grace is released, and one `up` runs per folder."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from taskstream.core.states import Status
from taskstream.core.store.sql import SqlStore
from tests.e2e.cli_rig import run_cli, wait_for
from tests.integration.harness import until
from tests.integration.outages import CLAIM_READ, lock, waiting
from tests.support.databases import temp_database

pytestmark = pytest.mark.roles

ROOT = Path(__file__).resolve().parents[2]

SLOW = """
tasks:
  - id: long
    agent: slow
    payload: {seconds: 60}
"""


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    env["TASKSTREAM_AGENT_MODULES"] = "tests.agents"
    env.update(extra)
    return env


def start_up(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    with (cwd / "up.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "taskstream", "up", *args],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def pids_in_session(sid: int) -> list[int]:
    """Every live process of session `sid` (the `up` of a test runs in its own)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == sid and (entry / "stat").read_text().split()[2] != "Z":
                out.append(int(entry.name))
        except (ProcessLookupError, OSError):
            continue
    return out


def valkey_pids(home: Path) -> list[int]:
    """Live valkey servers running in `home/valkey` (their working directory)."""
    want = (home / "valkey").resolve()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                Path(os.readlink(entry / "cwd")) == want
                and b"valkey" in (entry / "cmdline").read_bytes()
            ):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


@pytest.fixture
def reaper(tmp_path: Path) -> Iterator[list[Any]]:
    """Processes (Popen) and pids the test created, and every valkey left running on the
    test's `.taskstream/`; SIGKILLed (with their sessions) and reaped at the end."""
    started: list[Any] = []
    yield started
    procs = [p for p in started if isinstance(p, subprocess.Popen)]
    pids = [p.pid if isinstance(p, subprocess.Popen) else p for p in started]
    for pid in [*pids, *valkey_pids(tmp_path / ".taskstream")]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def instance_status(cwd: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(cwd / ".taskstream" / "taskstream.db")
    try:
        return list(db.execute("SELECT status, COALESCE(lease_owner, '') FROM task_instances"))
    finally:
        db.close()


def test_up_stop_releases_a_run_that_outlives_the_grace(tmp_path: Path, reaper: list[Any]) -> None:
    """operations.md (Stopping): after the grace the executor releases the unfinished run
    (RETRYING, due now) and exits 0; under `up` too, whose supervisor kills a child only
    `KILL_MARGIN_S` after the same grace."""
    (tmp_path / "tasks.yaml").write_text(SLOW)
    env = base_env(TASKSTREAM_SHUTDOWN_GRACE_S="2")
    proc = start_up(tmp_path, env, "--executors", "1")
    reaper.append(proc)
    assert wait_for((tmp_path / ".taskstream" / "endpoint.json").exists, 60)
    assert wait_for(lambda: b"executor.started" in (tmp_path / "up.log").read_bytes(), 60), (
        tmp_path / "up.log"
    ).read_text()
    run_cli("trigger", "long", env=env, cwd=tmp_path, check=True)
    assert wait_for(lambda: [s for s, _ in instance_status(tmp_path)] == ["RUNNING"], 30)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log = (tmp_path / "up.log").read_text()
    [(status, owner)] = instance_status(tmp_path)
    assert status == "RETRYING", (status, owner, log[-1500:])
    assert "child.killed" not in log


def test_up_killed_leaves_no_children_running(tmp_path: Path, reaper: list[Any]) -> None:
    """`up` killed outright (OOM killer, `kill -9`, a crashed terminal): its scheduler,
    sweeper, executors and the embedded Valkey end with it."""
    env = base_env()
    proc = start_up(tmp_path, env, "--executors", "1")
    reaper.append(proc)
    assert wait_for(lambda: b"executor.started" in (tmp_path / "up.log").read_bytes(), 60), (
        tmp_path / "up.log"
    ).read_text()
    valkeys = valkey_pids(tmp_path / ".taskstream")
    reaper.extend(valkeys)
    assert len(valkeys) == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def left() -> list[int]:
        home = tmp_path / ".taskstream"
        return pids_in_session(proc.pid) + [p for p in valkeys if p in valkey_pids(home)]

    # The children stop by themselves (their parent-death signal, then their own stop).
    assert wait_for(lambda: not left(), 30), f"still running after up was killed: {left()}"


def test_sigterm_while_up_starts_stops_the_embedded_valkey(
    tmp_path: Path, reaper: list[Any]
) -> None:
    """SIGTERM to `up` while it starts (here: while the migration waits for a database that
    accepts connections but never answers) stops the embedded Valkey it had started."""
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(8)
    port = hang.getsockname()[1]
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = hang.accept()
            except OSError:
                return
            held.append(conn)  # never answers: the MySQL handshake waits

    threading.Thread(target=accept, daemon=True).start()
    env = base_env(TASKSTREAM_DATABASE_URL=f"mysql://root@127.0.0.1:{port}/x")
    proc = start_up(tmp_path, env, "--executors", "0")
    reaper.append(proc)
    home = tmp_path / ".taskstream"
    try:
        assert wait_for(lambda: bool(held), 60), (tmp_path / "up.log").read_text()
        valkeys = valkey_pids(home)
        reaper.extend(valkeys)
        assert len(valkeys) == 1
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        stopped = wait_for(lambda: not valkey_pids(home), 30)
        assert stopped, f"up exited {code}; embedded valkey still running: {valkey_pids(home)}"
    finally:
        hang.close()
        for c in held:
            c.close()


def test_second_up_in_the_same_folder_refuses(tmp_path: Path, reaper: list[Any]) -> None:
    """A second `taskstream up` in a folder whose `up` is running refuses to start (a second
    Valkey on the same append-only file would overwrite the first one's data), names the
    running one, and leaves its endpoint file alone."""
    env = base_env()
    first = start_up(tmp_path, env, "--executors", "0")
    reaper.append(first)
    home = tmp_path / ".taskstream"
    assert wait_for((home / "endpoint.json").exists, 60)
    reaper.extend(valkey_pids(home))
    with (tmp_path / "up2.log").open("w") as log2:
        second = subprocess.Popen(
            [sys.executable, "-m", "taskstream", "up", "--executors", "0"],
            cwd=tmp_path,
            env=env,
            stdout=log2,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    reaper.append(second)
    exited = wait_for(lambda: second.poll() is not None, 20)
    reaper.extend(valkey_pids(home))
    endpoint_pid = json.loads((home / "endpoint.json").read_text())["pid"]
    assert exited and second.returncode == 1, (
        f"second up still running; valkeys on {home}: {valkey_pids(home)}; "
        f"endpoint.json now names pid {endpoint_pid} (first {first.pid}, second {second.pid})"
    )
    assert f"already running in .taskstream (pid {first.pid})" in (tmp_path / "up2.log").read_text()
    assert endpoint_pid == first.pid
    assert len(valkey_pids(home)) == 1


def test_up_restarts_its_embedded_valkey_when_it_dies(tmp_path: Path, reaper: list[Any]) -> None:
    """The embedded Valkey killed (the OOM killer, a crash): `up` starts it again on the same
    port and password, the roles reconnect, and work triggered afterwards runs."""
    env = base_env()
    proc = start_up(tmp_path, env, "--executors", "1")
    reaper.append(proc)
    up_log = tmp_path / "up.log"
    assert wait_for(lambda: b"executor.started" in up_log.read_bytes(), 60), up_log.read_text()
    home = tmp_path / ".taskstream"
    [first] = valkey_pids(home)
    os.kill(first, signal.SIGKILL)

    restarted = wait_for(lambda: b"valkey.restarted" in up_log.read_bytes(), 30)
    reaper.extend(valkey_pids(home))
    assert restarted, up_log.read_text()[-2000:]
    assert valkey_pids(home) not in ([], [first])
    (tmp_path / "tasks.yaml").write_text(SLOW.replace("seconds: 60", "seconds: 0"))
    run_cli("tasks", "apply", "tasks.yaml", env=env, cwd=tmp_path, check=True)
    run_cli("trigger", "long", env=env, cwd=tmp_path, check=True)
    assert wait_for(lambda: [s for s, _ in instance_status(tmp_path)] == ["SUCCESS"], 60), (
        instance_status(tmp_path),
        up_log.read_text()[-2000:],
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("where", ["home", "home/inside"])
def test_up_with_a_home_that_is_a_file_says_so(tmp_path: Path, where: str) -> None:
    """`TASKSTREAM_HOME` names a file (or a folder under one): a settings error naming it,
    exit 2, before anything starts."""
    (tmp_path / "home").write_text("not a folder")
    home = tmp_path / where
    out = run_cli("up", "--executors", "0", env=base_env(TASKSTREAM_HOME=str(home)), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"TASKSTREAM_HOME {home} is not a usable folder" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("TASKSTREAM_AGENT_MODULES", "agent module 'no_such_agents' cannot be imported"),
        ("TASKSTREAM_PRECONDITION_MODULES", "precondition module 'no_such_agents' cannot be"),
    ],
)
def test_up_without_a_task_file_refuses_a_module_setting_it_cannot_use(
    tmp_path: Path, setting: str, says: str
) -> None:
    """No task file to check the modules against: `up` still checks them before starting
    anything, instead of starting children that exit on them and restart for ever."""
    env = base_env(**{setting: "no_such_agents"})
    out = run_cli("up", "--executors", "1", env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert not (tmp_path / ".taskstream").exists()


RETRIED = """
tasks:
  - id: long
    agent: slow
    payload: {seconds: 60}
  - id: retried
    agent: flaky
    retry: {max_attempts: 2, backoff: {base: 4s}, jitter: 0}
    payload: {fail_until: 1}
"""


async def test_up_stop_releases_a_run_though_a_claim_holds_the_executor_up(
    tmp_path: Path, reaper: list[Any]
) -> None:
    """The stop comes while the executor's claim waits on the store (another transaction
    holds the row): the executor gives the step 1 s to end, cuts it off and gives the claim
    1 s more to land before it starts the grace. The run that outlives the grace is still
    released (RETRYING, due now, not counted): `up` must not kill the executor first, which
    would leave the run RUNNING for the sweeper to time out, spending an attempt."""
    async with temp_database("mariadb") as url:
        store = await SqlStore.connect(url)
        try:
            (tmp_path / "tasks.yaml").write_text(RETRIED)
            env = base_env(TASKSTREAM_SHUTDOWN_GRACE_S="1", TASKSTREAM_DATABASE_URL=url)
            proc = start_up(tmp_path, env, "--executors", "1")
            reaper.append(proc)
            up_log = tmp_path / "up.log"
            assert wait_for(lambda: b"executor.started" in up_log.read_bytes(), 60), (
                up_log.read_text()
            )
            run_cli("trigger", "long", env=env, cwd=tmp_path, check=True)
            [long_id] = await _instances(store)
            await until(lambda: _in(store, long_id, Status.RUNNING))
            run_cli("trigger", "retried", env=env, cwd=tmp_path, check=True)
            [retried_id] = [i for i in await _instances(store) if i != long_id]
            await until(lambda: _in(store, retried_id, Status.RETRYING))  # due in 4 s
            async with store.engine.connect() as locker, store.engine.connect() as watcher:
                await lock(locker, retried_id)  # its claim, 4 s on, waits for this
                try:
                    await until(lambda: waiting(watcher, CLAIM_READ))
                    proc.send_signal(signal.SIGTERM)
                    code = await asyncio.to_thread(proc.wait, 30)
                finally:
                    await locker.rollback()
            row = await store.get_instance(long_id)
            log = up_log.read_text()
            assert row is not None
            assert (code, row.status) == (0, Status.RETRYING), log[-3000:]
            assert "child.killed" not in log
        finally:
            await store.close()


async def _instances(store: SqlStore) -> list[str]:
    async with store.engine.connect() as conn:
        return [i for (i,) in (await conn.execute(text("SELECT id FROM task_instances"))).all()]


async def _in(store: SqlStore, instance_id: str, status: Status) -> bool:
    row = await store.get_instance(instance_id)
    return row is not None and row.status is status


@pytest.mark.parametrize("task_file", [False, True])
def test_up_refuses_an_agent_module_its_roles_cannot_import(
    tmp_path: Path, reaper: list[Any], task_file: bool
) -> None:
    """`python -m taskstream up` has its working folder on its import path, its roles
    (`python -P`) do not: a module found only there is refused at start, exit 2, instead of
    passing the check and every executor exiting on it and being started again for ever."""
    (tmp_path / "myagents.py").write_text("AGENTS = []\n")
    if task_file:
        (tmp_path / "tasks.yaml").write_text("tasks:\n  - id: t\n    agent: echo\n")
    proc = start_up(tmp_path, base_env(TASKSTREAM_AGENT_MODULES="myagents"), "--executors", "1")
    reaper.append(proc)
    exited = wait_for(lambda: proc.poll() is not None, 20)
    log = (tmp_path / "up.log").read_text()
    assert exited and proc.returncode == 2, log[-2000:]
    assert "agent module 'myagents' cannot be imported" in log
    assert not (tmp_path / ".taskstream").exists()


def test_a_relative_sqlite_store_is_found_from_another_folder(
    tmp_path: Path, reaper: list[Any]
) -> None:
    """`TASKSTREAM_DATABASE_URL=sqlite:///store.db` is read against the folder `up` runs in:
    a command run elsewhere, pointed at the cluster by `TASKSTREAM_HOME`, must open that file,
    not make an empty one of the same name in its own folder."""
    env = base_env(TASKSTREAM_DATABASE_URL="sqlite:///store.db")
    proc = start_up(tmp_path, env, "--executors", "0")
    reaper.append(proc)
    home = tmp_path / ".taskstream"
    assert wait_for((home / "endpoint.json").exists, 60), (tmp_path / "up.log").read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_cli("status", "--json", env=base_env(TASKSTREAM_HOME=str(home)), cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    assert not (elsewhere / "store.db").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
