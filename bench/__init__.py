"""`scripts/bench`: taskstream measured against a raw baseline on this machine (see
docs/benchmarks.md). Not part of the installed package."""
