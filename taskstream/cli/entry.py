"""The console script's entry. It imports nothing of its own before the CLI, so that a Ctrl-C
while the CLI's modules load (a few tenths of a second) ends the command quietly, exit 130
as a shell reports an interrupt, instead of printing a traceback of the import."""

from __future__ import annotations

import sys

INTERRUPTED = 130
"""Exit status of a command interrupted by SIGINT (128 + 2), as shells report it."""


def run() -> None:
    """Load the CLI and run it (`taskstream.cli.main.run`)."""
    try:
        from taskstream.cli.main import run as main  # noqa: PLC0415 - the point of this module
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
    main()
