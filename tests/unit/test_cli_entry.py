"""The console script's entry: a Ctrl-C while the CLI's modules load ends the command with exit
130 and no traceback."""

from __future__ import annotations

import builtins
import sys
from typing import Any

import pytest

from taskstream.cli import entry


def test_a_ctrl_c_while_the_cli_loads_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def interrupted(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "taskstream.cli.main":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "taskstream.cli.main", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    try:
        entry.run()
    except KeyboardInterrupt:  # what a shell would show as a traceback
        pytest.fail("the interrupt escaped the entry")
    except SystemExit as exited:
        assert exited.code == entry.INTERRUPTED
    else:
        pytest.fail("the entry went on without the CLI")


def test_the_entry_runs_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    from taskstream.cli import main

    ran: list[bool] = []
    monkeypatch.setattr(main, "run", lambda: ran.append(True))
    entry.run()
    assert ran == [True]
