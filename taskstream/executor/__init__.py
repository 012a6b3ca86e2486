"""taskstream.executor."""
