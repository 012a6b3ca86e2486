"""Text the CLI prints reaches the terminal as text: control characters are shown as `\\xNN`."""

from __future__ import annotations

from taskstream.cli.shown import shown


def test_control_characters_are_shown_escaped_and_the_rest_kept() -> None:
    assert shown("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert shown("over\rwrite\x00\x7f\x9b31m") == "over\\x0dwrite\\x00\\x7f\\x9b31m"
    assert shown("line\n\tindented, café, 日本, [bold]") == "line\n\tindented, café, 日本, [bold]"
