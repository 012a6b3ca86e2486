"""Importing the modules a setting names (`TASKSTREAM_AGENT_MODULES`,
`TASKSTREAM_PRECONDITION_MODULES`)."""

from __future__ import annotations

import importlib
from types import ModuleType

from taskstream.core.errors import ConfigError


def import_named(kind: str, name: str) -> ModuleType:
    """Import the `kind` module `name`; a `ConfigError` naming it and what went wrong when it
    cannot be (not found, a relative name, or an error raised by its own code)."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # its own code may raise anything while it is imported
        raise ConfigError(
            [f"{kind} module {name!r} cannot be imported: {type(exc).__name__}: {exc}"]
        ) from exc
