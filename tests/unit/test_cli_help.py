"""Every help text of the CLI reaches the terminal whole: rich reads `[...]` as markup and
drops it, which once turned `[default: tasks.yaml, if present]` into nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from rich.markup import render

from taskstream.cli.main import app


def _helps(command: Any, path: str) -> Iterator[tuple[str, str]]:
    """(where, text) of a command's help and of each of its parameters', recursively."""
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _helps(sub, f"{path} {name}")


def test_no_help_text_loses_words_to_rich_markup() -> None:
    helps = list(_helps(typer.main.get_command(app), "taskstream"))
    assert len(helps) > 40
    swallowed = [(where, text) for where, text in helps if render(text).plain != text]
    assert swallowed == []


def test_up_help_names_its_defaults() -> None:
    helps = dict(_helps(typer.main.get_command(app), "taskstream"))
    assert "tasks.yaml" in helps["taskstream up tasks"]
    assert "TASKSTREAM_EXECUTOR_CONCURRENCY" in helps["taskstream up concurrency"]
