"""The `taskstream` command: the composition root that wires the packages together."""
