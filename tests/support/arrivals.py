"""An upstream that keeps its own arrival log, and the arithmetic over such logs.

Run as a process: `python -m tests.support.arrivals LOG`. It listens on 127.0.0.1 (ephemeral
port), prints one JSON line `{"port": N}` on stdout when it accepts connections, and answers
every request `200 ok` (`Connection: close`). The moment each request's first line is read it
appends `time.monotonic_ns()` (one integer per line, flushed at once) to LOG, so the log is
complete up to the last answered request whenever the process is stopped. It stops on
SIGTERM, SIGINT, or when its stdin closes (so it never outlives the test that started it).

CLOCK_MONOTONIC is one clock for every process on the host, and libfaketime leaves it alone
when `FAKETIME_DONT_FAKE_MONOTONIC=1`, so the log compares with other processes' monotonic
readings.

The pure functions below (`max_in_window`, `min_span`, `count_from`) read a sorted log of
arrival times in seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def read_log(path: Path) -> list[float]:
    """The arrival times (monotonic seconds) in LOG, sorted."""
    text = path.read_text() if path.exists() else ""
    return sorted(int(line) / 1e9 for line in text.split())


def max_in_window(arrivals: Sequence[float], window_s: float) -> int:
    """The most arrivals any half-open span `[t, t + window_s)` holds (0 for none).

    The fullest span can always be moved to start at an arrival, so only those are tried."""
    return max(
        (bisect.bisect_left(arrivals, t + window_s) - i for i, t in enumerate(arrivals)),
        default=0,
    )


def min_span(arrivals: Sequence[float], k: int) -> float | None:
    """The shortest time from arrival i to arrival i + k (None when there are at most k).

    Arrivals i..i+k are k + 1 calls, so `min_span(log, limit) >= window` means no span of
    `window` held more than `limit` of them."""
    spans = [arrivals[i + k] - arrivals[i] for i in range(len(arrivals) - k)]
    return min(spans, default=None)


def count_from(arrivals: Sequence[float], start: float, span_s: float) -> int:
    """How many arrivals fall in `[start, start + span_s)`."""
    return bisect.bisect_left(arrivals, start + span_s) - bisect.bisect_left(arrivals, start)


class _Recorder:
    def __init__(self, log: TextIO) -> None:
        self._log = log

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if not line:
                return
            self._log.write(f"{time.monotonic_ns()}\n")
            self._log.flush()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers: the clients here send no body
            writer.write(_REPLY)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _stop_at_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set `stop` once stdin closes (the parent has gone), from a daemon thread."""

    def wait() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait, daemon=True).start()


async def serve(log_path: Path) -> None:
    """Record and answer requests until SIGTERM, SIGINT or the end of stdin."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _stop_at_eof(loop, stop)
    with log_path.open("a") as log:
        server = await asyncio.start_server(_Recorder(log).handle, "127.0.0.1", 0, backlog=512)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"port": port}), flush=True)
        async with server:
            await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
