"""`taskstream up` on the embedded defaults, driven as a user would from two shells."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from taskstream.cli.redis_cli import CLIENTS
from tests.e2e.cli_rig import run_cli, wait_for

pytestmark = pytest.mark.roles

TASKS = """
tasks:
  - id: tick
    agent: echo
    schedule: {every: 1s}
    payload: {hello: world}
"""


def cli(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    return run_cli(*args, env=env, cwd=cwd, check=check)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    (tmp_path / "tasks.yaml").write_text(TASKS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskstream", "up", "--executors", "2"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    yield tmp_path, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def status(cwd: Path) -> dict[str, object] | None:
    out = cli(cwd, "status", "--json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def test_up_runs_instances_to_success_and_stops_cleanly(
    cluster: tuple[Path, subprocess.Popen[str]],
) -> None:
    cwd, proc = cluster

    def succeeded() -> bool:
        st = status(cwd)
        return bool(st) and st["instances"]["SUCCESS"] >= 2  # type: ignore[index]

    assert wait_for(succeeded, 30), (cwd / "up.log").read_text()[-3000:]
    redis_url = cli(cwd, "url", "redis").stdout.strip()
    client = redis.Redis.from_url(redis_url)
    groups = client.xinfo_groups("ts:{default}:stream:default")
    assert groups[0]["name"] == b"executors"
    consumers = client.xinfo_consumers("ts:{default}:stream:default", "executors")
    assert len(consumers) >= 1
    listed = json.loads(cli(cwd, "instances", "--status", "SUCCESS", "--json").stdout)
    inspected = json.loads(cli(cwd, "inspect", listed[0]["id"], "--json").stdout)
    assert [h["to_status"] for h in inspected["history"]] == [
        "PENDING",
        "DISPATCHED",
        "RUNNING",
        "SUCCESS",
    ]
    assert inspected["instance"]["result"] == {"hello": "world"}
    client.close()
    assert_private(cwd / ".taskstream", redis_url)
    assert_redis_cli_reaches_the_queue(cwd)

    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 10
    assert not (cwd / ".taskstream" / "endpoint.json").exists()
    assert cli(cwd, "status", check=False).returncode == 1


def assert_private(home: Path, redis_url: str) -> None:
    """The home folder, the endpoint file, the store and the server's config are the owner's
    only, and the embedded server refuses a client that does not give the password they
    hold."""
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in (
            home,
            home / "endpoint.json",
            home / "taskstream.db",
            home / "valkey",
            home / "valkey" / "valkey.conf",
        )
    }
    assert modes == {
        ".taskstream": 0o700,
        "endpoint.json": 0o600,
        "taskstream.db": 0o600,
        "valkey": 0o700,
        "valkey.conf": 0o600,
    }
    url = urlsplit(redis_url)
    log = (home.parent / "up.log").read_text(errors="replace")
    assert url.password and url.password not in log
    anonymous = redis.Redis(host=url.hostname or "", port=url.port or 0)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    anonymous.close()


def assert_redis_cli_reaches_the_queue(cwd: Path) -> None:
    """`taskstream redis-cli` logs in to the password-protected server as the README shows."""
    if not any(shutil.which(name) for name in CLIENTS):
        pytest.skip("no redis-cli or valkey-cli on PATH")
    out = cli(cwd, "redis-cli", "XINFO", "GROUPS", "ts:{default}:stream:default")
    assert "executors" in out.stdout.split(), out.stdout + out.stderr
    assert "AUTH" not in out.stderr and "NOAUTH" not in out.stdout


def test_validate_reports_every_problem_and_writes_nothing(tmp_path: Path) -> None:
    bad = Path(__file__).parents[1] / "fixtures" / "bad_tasks.yaml"
    out = cli(tmp_path, "tasks", "validate", str(bad), check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 4, out.stderr
    assert all(str(bad) in line for line in lines)
    assert not (tmp_path / ".taskstream").exists()
