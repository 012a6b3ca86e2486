"""Skewing a child process's wall clock with libfaketime (LD_PRELOAD).

`scripts/fault` runs `ensure_faketime` (scripts/lib/services.sh), which installs Debian's
`faketime` when it can and exports `TASKSTREAM_TEST_LIBFAKETIME`; without that variable the
usual library paths are searched. A missing library is an error, never a skip: a clock-skew
run that does not skew shows nothing.

Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`): timeouts, sleeps and the
arrival log keep the real monotonic clock, so the only thing a test changes is what
`time.time()` (and every UTC timestamp derived from it) says.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

ENV = "TASKSTREAM_TEST_LIBFAKETIME"
PATTERNS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


class FaketimeMissing(RuntimeError):
    """libfaketime.so.1 is not installed where the tests look for it."""


def libfaketime() -> Path:
    """The library to preload; raises `FaketimeMissing` naming what was tried."""
    named = os.environ.get(ENV)
    candidates = [named] if named else [p for pattern in PATTERNS for p in glob.glob(pattern)]
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    tried = f"{ENV}={named}" if named else ", ".join(PATTERNS)
    raise FaketimeMissing(
        f"libfaketime.so.1 not found (tried {tried}); run scripts/fault, which installs "
        "Debian's `faketime` as root, or `apt-get install faketime`"
    )


def skew_env(lib: Path, offset_s: int) -> dict[str, str]:
    """Environment entries that shift a child's wall clock by `offset_s` seconds."""
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": f"{offset_s:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
