"""Fixtures every test layer shares. Layer-specific fixtures live in each layer's conftest."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.support import databases

# The CLI's consoles take their width from COLUMNS when first imported: in-process CLI tests
# (CliRunner) see one wide console whatever terminal, if any, runs the suite.
os.environ["COLUMNS"] = "250"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the Redis server tests may use; `scripts/test` provisions it and exports it."""
    return os.environ.get("TASKSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, so tests can share one Redis and one database."""
    return "t" + uuid.uuid4().hex[:12]


PROCESS_LAYERS = ("fault",)
"""Layers whose tests start role processes and wait on their timing; elsewhere such tests
are marked `roles`."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `pytest -n 2 --dist loadgroup` (scripts/test), the tests that start role
    processes share one worker and so run one at a time, as they do alone; every other test
    (one-shot CLI commands included) goes to whichever worker is free."""
    for item in items:
        layer = item.path.parent.name
        if layer in PROCESS_LAYERS or item.get_closest_marker("roles") is not None:
            item.add_marker(pytest.mark.xdist_group("processes"))


def pytest_sessionfinish() -> None:
    """Drop the databases this process made ahead for tests that never came, and the
    migrated templates it copied its databases from."""
    databases.close()
