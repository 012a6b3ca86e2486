"""taskstream: scheduled work on Redis Streams with a SQL store as the source of truth."""

__version__ = "0.1.0"
