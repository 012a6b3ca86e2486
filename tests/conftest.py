"""Fixtures every test layer shares. Layer-specific fixtures live in each layer's conftest."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the Redis server tests may use; `scripts/test` provisions it and exports it."""
    return os.environ.get("TASKSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, so tests can share one Redis and one database."""
    return "t" + uuid.uuid4().hex[:12]
