"""Every help text of the CLI reaches the terminal whole: rich reads `[...]` as markup and
drops it, which once turned `[default: tasks.yaml, if present]` into nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from rich.markup import render
from typer.testing import CliRunner

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


def _shown(path: list[str]) -> list[str]:
    """The lines `taskstream PATH --help` prints on a terminal wide enough for any line, the
    panels' borders and runs of spaces taken out."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"}, color=False)
    assert result.exit_code == 0, result.output
    lines = result.output.translate(str.maketrans("│╭╮╰╯─", "      ")).splitlines()
    return [" ".join(line.split()) for line in lines]


def _flat(text: str) -> str:
    return " ".join(text.split()).replace("`", "")


def test_every_help_text_is_shown_whole_and_unbroken() -> None:
    """On a wide terminal each command's first paragraph is one line of its group's list,
    and each help (the command's, its parameters') shows as written: a docstring's line
    breaks once broke the list of commands mid-sentence."""
    root = typer.main.get_command(app)
    subs = {n: c for n, c in getattr(root, "commands", {}).items() if hasattr(c, "commands")}
    groups: dict[str, Any] = {"": root, **subs}
    for prefix, group in groups.items():
        listing = _shown(prefix.split())
        for name, command in group.commands.items():
            first = _flat((command.help or "").split("\n\n")[0])
            assert f"{name} {first}" in listing, (prefix, name)
            if hasattr(command, "commands"):
                continue  # a group: its commands are checked with it as the prefix
            shown = " ".join(_shown([*prefix.split(), name]))
            for _, text in _helps(command, name):
                assert _flat(text) in shown, (prefix, name, text)
