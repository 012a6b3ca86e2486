"""`taskstream redis-cli`: the redis-cli call it makes, with the password kept off argv."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskstream.cli.redis_cli import find_client, invocation
from taskstream.core.errors import TaskstreamError


def test_a_password_goes_in_the_environment_never_in_argv() -> None:
    call = invocation("redis-cli", "redis://:s%40cret@127.0.0.1:7001/3", ["XLEN", "k"])
    assert call.argv == ["redis-cli", "-h", "127.0.0.1", "-p", "7001", "-n", "3", "XLEN", "k"]
    assert call.env == {"REDISCLI_AUTH": "s@cret"}
    assert not any("cret" in arg for arg in call.argv)


def test_user_tls_and_defaults_are_passed_on() -> None:
    call = invocation("valkey-cli", "rediss://ops:pw@cache.internal/", ["PING"])
    assert call.argv == [
        "valkey-cli", "-h", "cache.internal", "-p", "6379", "-n", "0",
        "--tls", "--user", "ops", "PING",
    ]  # fmt: skip
    assert call.env == {"REDISCLI_AUTH": "pw"}


def test_a_unix_socket_and_no_password() -> None:
    call = invocation("redis-cli", "unix:///run/redis.sock?db=2", [])
    assert call.argv == ["redis-cli", "-s", "/run/redis.sock", "-n", "2"]
    assert call.env == {}


def test_the_client_is_found_on_the_path_or_named_as_missing(tmp_path: Path) -> None:
    with pytest.raises(TaskstreamError, match="no redis-cli or valkey-cli on PATH"):
        find_client(str(tmp_path))
    client = tmp_path / "valkey-cli"
    client.write_text("#!/bin/sh\n")
    client.chmod(0o755)
    assert find_client(str(tmp_path)) == str(client)
