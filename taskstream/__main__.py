"""`python -m taskstream` runs the CLI."""

from taskstream.cli.main import run

run()
