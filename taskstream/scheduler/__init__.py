"""taskstream.scheduler."""
