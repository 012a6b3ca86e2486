"""A TCP forwarder for tests: listens on given addresses and relays each connection to one
target (a database on 127.0.0.1, say), byte for byte, in the test's event loop.

`blackhole()` makes it a network that lost its packets: the connections stay open, but
nothing more is relayed either way and new connections are accepted but never reach the
target; no reset is sent. `restore()` relays again, bytes held meanwhile included, as TCP
delivers them once a partition heals.

    async with Forwarder([("10.251.7.1", 0)], ("127.0.0.1", 3306)) as fwd:
        fwd.port  # where it listens, on every address
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from tests.support.loopback import end_tasks

CHUNK = 65_536


class Forwarder:
    """`async with Forwarder(listen, target) as fwd:`; every address of `listen` gets the
    same port (the first one's, 0 for a free one)."""

    def __init__(self, listen: Sequence[tuple[str, int]], target: tuple[str, int]) -> None:
        self._listen = list(listen)
        self._target = target
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0
        self.accepted = 0
        """Connections accepted so far."""

    def blackhole(self) -> None:
        """Relay nothing more, either way, until `restore`."""
        self._flowing.clear()

    def restore(self) -> None:
        self._flowing.set()

    async def __aenter__(self) -> Forwarder:
        host, port = self._listen[0]
        first = await asyncio.start_server(self._handle, host, port)
        self.port = first.sockets[0].getsockname()[1]
        self._servers.append(first)
        for host, _ in self._listen[1:]:
            self._servers.append(await asyncio.start_server(self._handle, host, self.port))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in self._servers:
            server.close()
        self._flowing.set()
        for writer in list(self._writers):
            writer.close()
        # Closed ends make every relay read EOF; a task is cancelled only when one does not.
        await end_tasks(self._tasks)
        for server in self._servers:
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        ends = [writer]
        self._writers.add(writer)
        try:
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            ends.append(up_writer)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            self._tasks.discard(task)
            for end in ends:
                self._writers.discard(end)
                end.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until EOF; bytes read while blackholed are held until `restore`."""
        try:
            while data := await reader.read(CHUNK):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.close()
