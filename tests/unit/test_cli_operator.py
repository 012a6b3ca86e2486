"""Who an operator command records as its author."""

from __future__ import annotations

import getpass
import os

import pytest

from taskstream.cli.common import operator


def test_the_login_name_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "ops-alice")
    assert operator() == "ops-alice"


def test_a_uid_without_a_name_is_recorded_as_the_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container run with an arbitrary uid has no passwd entry and no USER or LOGNAME:
    `taskstream retry` must still record who asked, not fail with a traceback."""

    def no_name() -> str:
        raise KeyError(f"getpwuid(): uid not found: {os.getuid()}")

    monkeypatch.setattr(getpass, "getuser", no_name)
    assert operator() == f"uid:{os.getuid()}"
