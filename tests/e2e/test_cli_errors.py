"""Bad settings and an unreachable Redis end a command with one line naming what is wrong (exit
2 for settings, 1 for an outage), never a traceback; a URL's password is never printed.
`status` still shows what the store says while Redis is down. A long-running role waits for
Redis instead."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.e2e.cli_rig import migrated_store, role_process, run_cli, wait_for

DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def _env(tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_DATABASE_URL"] = f"sqlite:///{tmp_path / 'store.db'}"
    return env | {f"TASKSTREAM_{k.upper()}": v for k, v in settings.items()}


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("namespace", "bad/ns", "TASKSTREAM_NAMESPACE"),
        ("log_level", "bogus", "TASKSTREAM_LOG_LEVEL"),
        ("shutdown_grace_s", "inf", "TASKSTREAM_SHUTDOWN_GRACE_S"),
        ("executor_concurrency", "abc", "TASKSTREAM_EXECUTOR_CONCURRENCY"),
        ("max_payload_bytes", str(16 * 1024 * 1024), "TASKSTREAM_MAX_PAYLOAD_BYTES"),
        ("redis_url", "http://:hunter2@127.0.0.1:6379", "TASKSTREAM_REDIS_URL"),
        ("redis_url", "bogus", "TASKSTREAM_REDIS_URL"),
        ("database_url", "mysql://root:hunter2@127.0.0.1:notaport/x", "TASKSTREAM_DATABASE_URL"),
    ],
)
def test_an_invalid_setting_is_named_in_one_line(
    tmp_path: Path, setting: str, value: str, named: str
) -> None:
    out = run_cli("status", env=_env(tmp_path, **{setting: value}))
    assert out.returncode == 2
    assert out.stderr.startswith(named + ": ")
    assert len(out.stderr.strip().splitlines()) == 1
    assert "hunter2" not in out.stderr


def test_redis_down_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = _env(tmp_path, redis_url=DOWN)
    migrated_store(tmp_path)
    out = run_cli("dead", "list", env=env)
    assert out.returncode == 1
    assert out.stderr.startswith("error: redis unavailable: ConnectionError")
    assert "Traceback" not in out.stderr


def test_a_command_whose_redis_login_is_refused_says_what_to_check(
    tmp_path: Path, redis_url: str
) -> None:
    """The same words as the roles' logs: Redis named, and the URL's user and password."""
    env = _env(tmp_path, redis_url=_wrong_login(redis_url))
    migrated_store(tmp_path)
    out = run_cli("dead", "list", env=env)
    assert out.returncode == 1
    assert out.stderr.startswith("error: redis unavailable: AuthenticationError: "), out.stderr
    assert "(check the user and password in TASKSTREAM_REDIS_URL)" in out.stderr
    assert "hunter2" not in out.stderr


def _wrong_login(redis_url: str) -> str:
    """`redis_url` as a user Redis does not have, with the password `hunter2`."""
    parts = urlsplit(redis_url)
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"ts-nobody:hunter2@{parts.hostname}{port}"))


@pytest.mark.roles
def test_a_role_waits_for_redis_down_at_start_and_stops_cleanly(tmp_path: Path) -> None:
    """A long-running role waits for Redis as for an outage later on: it logs the outage
    (no traceback, no password), keeps running, and a stop exits 0."""
    env = _env(tmp_path, redis_url="redis://:hunter2@127.0.0.1:1/0")
    migrated_store(tmp_path)
    log = tmp_path / "sweeper.log"
    with role_process("sweeper", env, log) as proc:
        assert wait_for(lambda: "startup.dependency_down" in log.read_text(), 30)
        assert proc.poll() is None, log.read_text()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "startup.dependency_down" in text and "127.0.0.1:1" in text
    assert "Traceback" not in text and "hunter2" not in text


@pytest.mark.roles
def test_a_role_whose_redis_login_is_refused_names_redis_and_what_to_check(
    tmp_path: Path, redis_url: str
) -> None:
    """The server's own reply names no server: the outage a role logs says it is Redis's,
    and that the URL's user and password are what to check."""
    env = _env(tmp_path, redis_url=_wrong_login(redis_url))
    migrated_store(tmp_path)
    log = tmp_path / "sweeper.log"
    with role_process("sweeper", env, log) as proc:
        assert wait_for(lambda: "startup.dependency_down" in log.read_text(), 30)
        assert proc.poll() is None, log.read_text()
    [first, *_] = [
        json.loads(line) for line in log.read_text().splitlines() if "dependency_down" in line
    ]
    assert first["error"].startswith("redis unavailable: AuthenticationError: "), first
    assert first["error"].endswith("(check the user and password in TASKSTREAM_REDIS_URL)")
    assert "hunter2" not in log.read_text()


def test_status_with_redis_down_shows_the_stores_counts_and_exits_1(tmp_path: Path) -> None:
    """The store is the truth and still answers: `status` shows its counts, says Redis is
    unavailable (streams and upstreams unknown), and exits 1; `--json` carries the same."""
    env = _env(tmp_path, redis_url="redis://:hunter2@127.0.0.1:1/0")
    migrated_store(tmp_path)
    out = run_cli("status", env=env)
    assert out.returncode == 1
    assert "redis unavailable: ConnectionError" in out.stdout
    assert "instances: PENDING=0" in out.stdout
    assert "Traceback" not in out.stderr
    as_json = run_cli("status", "--json", env=env)
    assert as_json.returncode == 1
    data = json.loads(as_json.stdout)
    assert data["redis_error"].startswith("ConnectionError")
    assert data["instances"]["SUCCESS"] == 0 and "streams" not in data
    assert "hunter2" not in out.stdout + out.stderr + as_json.stdout + as_json.stderr
