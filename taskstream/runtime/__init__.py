"""Process wiring: the embedded defaults, the endpoint file, and the `up` supervisor."""
