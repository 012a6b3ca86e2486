"""A minimal HTTP/1.1 server on 127.0.0.1 with an ephemeral port, for upstream tests.

Every request is recorded in `seen` (its arrival log; `arrived` is set at the first) and
answered by `reply`, one request per connection (`Connection: close`). A reply with `hold` set
is sent only once that event is set (an upstream that does not answer); leaving the server
releases every held reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

_REASONS = {
    200: "OK",
    201: "Created",
    301: "Moved Permanently",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Seen:
    """One request as it arrived; header names are lower case."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    """What the server answers."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hold: asyncio.Event | None = None

    @classmethod
    def json(cls, status: int, value: Any, **headers: str) -> Reply:
        headers = {"Content-Type": "application/json", **headers}
        return cls(status, json.dumps(value).encode(), headers)


class Loopback:
    """`async with Loopback(reply) as server:`; `server.url("/path")` is where it listens."""

    def __init__(self, reply: Reply | Callable[[Seen], Reply] | None = None) -> None:
        self.reply = reply or Reply()
        self.seen: list[Seen] = []
        self.arrived = asyncio.Event()
        """Set once the first request has arrived."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._holds: list[asyncio.Event] = []
        self._handlers: set[asyncio.Task[Any]] = set()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def __aenter__(self) -> Loopback:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for hold in self._holds:
            hold.set()
        assert self._server is not None
        self._server.close()
        await end_tasks(self._handlers)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            seen = await _read_request(reader)
            if seen is None:
                return
            self.seen.append(seen)
            self.arrived.set()
            reply = self.reply(seen) if callable(self.reply) else self.reply
            if reply.hold is not None:
                self._holds.append(reply.hold)
                await reply.hold.wait()
            writer.write(_encode(reply))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return Seen(method, target, headers, body)


def _encode(reply: Reply) -> bytes:
    head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
    headers = {"Content-Length": str(len(reply.body)), "Connection": "close", **reply.headers}
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def end_tasks(tasks: Collection[asyncio.Task[Any]], within_s: float = 5.0) -> None:
    """Wait up to `within_s` for a test server's connection tasks to end by themselves (their
    ends were closed), then cancel those that did not, and wait for them."""
    if not tasks:
        return
    _, stuck = await asyncio.wait(tasks, timeout=within_s)
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
