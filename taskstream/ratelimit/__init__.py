"""taskstream.ratelimit."""
