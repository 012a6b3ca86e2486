"""`taskstream up` whose log reader goes away: `taskstream up 2>&1 | tee up.log` stopped with
Ctrl-C, which ends `tee` at once while `up` and its roles stop cleanly. Every log line after
that meets a pipe with no reader (EPIPE; a closed terminal gives EIO): the stop must go on
as it would otherwise, the unfinished run released and `up` exiting 0."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.e2e.cli_rig import run_cli, wait_for
from tests.e2e.test_up_lifetime import (
    SLOW,
    base_env,
    instance_status,
    pids_in_session,
    valkey_pids,
)

pytestmark = pytest.mark.roles


class Reader:
    """Reads a pipe on a thread of its own (so the writers never block on a full pipe) until
    `leave`, which closes the pipe's read end: the writers' next writes fail with EPIPE."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._seen = bytearray()
        self._leaving = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._leaving.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if ready and not (chunk := os.read(self._fd, 65536)):
                break
            if ready:
                self._seen += chunk
        os.close(self._fd)

    def seen(self, text: bytes) -> bool:
        return text in bytes(self._seen)

    def leave(self) -> None:
        """Close the read end (once the thread is done with it); again does nothing."""
        self._leaving.set()
        self._thread.join(5)


def test_up_stops_cleanly_when_its_log_reader_is_gone(tmp_path: Path) -> None:
    (tmp_path / "tasks.yaml").write_text(SLOW)
    env = base_env(TASKSTREAM_SHUTDOWN_GRACE_S="1")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskstream", "up", "--executors", "1"],
        cwd=tmp_path,
        env=env,
        stdout=write_fd,
        stderr=write_fd,
        start_new_session=True,
    )
    os.close(write_fd)
    reader = Reader(read_fd)
    try:
        assert wait_for(lambda: reader.seen(b"executor.started"), 60)
        run_cli("trigger", "long", env=env, cwd=tmp_path, check=True)
        assert wait_for(lambda: [s for s, _ in instance_status(tmp_path)] == ["RUNNING"], 30)
        reader.leave()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        [(status, owner)] = instance_status(tmp_path)
        assert (status, owner) == ("RETRYING", ""), "the run was not released at the stop"
        assert wait_for(lambda: not pids_in_session(proc.pid), 10), pids_in_session(proc.pid)
    finally:
        reader.leave()
        _kill(proc, tmp_path / ".taskstream")


def _kill(proc: subprocess.Popen[bytes], home: Path) -> None:
    """SIGKILL what the test may have left: `up`'s session and its embedded Valkey."""
    for pid in valkey_pids(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
