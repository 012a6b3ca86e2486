"""`python -m taskstream` runs the CLI."""

from taskstream.cli.entry import run

run()
