"""What ties the processes of `taskstream up` to it: children that end when it dies, and one
`up` per home folder.

`guarded(argv)` is the command line that runs `argv` as a child which gets SIGTERM when the
process that started it dies (Linux `PR_SET_PDEATHSIG`, which survives the exec), so a
SIGKILLed `up` (the OOM killer, `kill -9`) leaves neither role processes nor its embedded
Valkey running. The signal is armed by this module run as a program, which then execs `argv`
in the same process (same pid), rather than by a `preexec_fn`, which is unsafe in a process
with threads. Elsewhere than Linux `argv` runs as it is, and outlives a killed `up`.

Ctrl-C reaches every process of the terminal's foreground group: `up` and its roles alike.
`up` stops its roles itself (SIGTERM), so a role it starts ignores SIGINT from its first
instant: `InterruptsHeld` starts it with SIGINT blocked (the signal mask survives fork and
exec, even through the wrapper above), and the role then ignores it (`interrupts_ignored`),
so no Ctrl-C cuts off its imports with a traceback. A role run alone stops on Ctrl-C.

`HomeLock` holds an exclusive `flock` on `<home>/up.lock` for the life of `up`: a second `up`
in the same folder would start a second Valkey on the same append-only file, and the two would
overwrite each other's data. The kernel drops the lock when its holder dies, however it dies,
so `holder(home)` says which `up` runs there: a pid alone may since name another process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

from taskstream.core.errors import ConfigError, TaskstreamError

_PR_SET_PDEATHSIG = 1
LOCK_FILE = "up.lock"
LOOK_WAIT_S = 0.2
"""How long `HomeLock` waits for a lock taken (s): `holder` takes it shared for an instant."""


def python_module(module: str, *args: str) -> list[str]:
    """Command line running `module` with this interpreter. `-P`: the working folder is not
    put on the import path (a `queue.py` there must not replace the standard library's, nor
    a source tree the installed package)."""
    return [sys.executable, "-P", "-m", module, *args]


@contextmanager
def import_as_children() -> Iterator[None]:
    """Within: this process's import path without the entry Python put first (the working
    folder under `python -m`, the script's folder under a console script), which `-P` keeps
    off the path of `python_module`'s children, so a module imported here is one they can
    import too."""
    saved = list(sys.path)
    if not sys.flags.safe_path and sys.path:
        del sys.path[0]
    try:
        yield
    finally:
        sys.path[:] = saved


def guarded(argv: list[str]) -> list[str]:
    """The command line running `argv` so that it gets SIGTERM when this process dies."""
    if not sys.platform.startswith("linux"):
        return argv
    return python_module(__name__, str(os.getpid()), *argv)


def _arm_and_exec(parent: int, argv: list[str]) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(1)
    os.execv(argv[0], argv)  # noqa: S606 - argv as given by `guarded`, no shell


class InterruptsHeld:
    """Child starts with SIGINT blocked in this thread, so each child starts with it blocked.
    Children started at once (tasks of one event loop) unblock it when the last start ends.
    A SIGINT for this process meanwhile stays pending and comes right after: none is lost."""

    def __init__(self) -> None:
        self._starts = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """Within: SIGINT blocked (for the first of nested starts, unblocked after the last)."""
        if self._starts == 0:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        self._starts += 1
        try:
            yield
        finally:
            self._starts -= 1
            if self._starts == 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupts_ignored() -> bool:
    """Whether this process is to leave SIGINT alone: it started with SIGINT blocked (a role
    `up` started, see `InterruptsHeld`), which is then ignored, a pending one discarded, and
    unblocked; or it started with SIGINT ignored (`nohup`, a background job of a script).
    Call it from the main thread."""
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return True
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


class AlreadyRunning(TaskstreamError):
    """Another `taskstream up` holds this home folder."""


def holder(home: Path) -> int | None:
    """The pid of the `up` holding `home` now, None when none does (or it is still writing
    its pid). Looks by taking the lock shared, let go at once."""
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    finally:
        os.close(fd)  # closing drops the shared lock, when this look took it
    return None


def _take(fd: int) -> bool:
    """Take the exclusive lock on `fd`, waiting up to `LOOK_WAIT_S` for a `holder` look."""
    deadline = time.monotonic() + LOOK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        else:
            return True


class HomeLock:
    """An exclusive lock on `<home>/up.lock`, held from `__enter__` to `__exit__`."""

    def __init__(self, home: Path) -> None:
        self._path = home / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> Self:
        """Take the lock; `AlreadyRunning` (naming the holder's pid when known) if taken."""
        # Owner-only when created here: the folder holds the store, the endpoint file and the
        # embedded server's data.
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                [f"TASKSTREAM_HOME {self._path.parent} is not a usable folder: {exc.strerror}"]
            ) from exc
        if not _take(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"taskstream up is already running in {self._path.parent} (pid {holder}); "
                "stop it first, or set TASKSTREAM_HOME to another folder"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:  # a full disk: a clear error, not a traceback
            os.close(fd)
            raise ConfigError([f"cannot write {self._path}: {exc.strerror or exc}"]) from exc
        self._fd = fd
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


if __name__ == "__main__":
    _arm_and_exec(int(sys.argv[1]), sys.argv[2:])
