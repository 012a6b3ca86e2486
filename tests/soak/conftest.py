"""Soak fixtures: the fault layer's `cluster` (a fresh MariaDB database and namespace, role
processes started by the test, everything removed afterwards) and `libfaketime` for the
clock-skew runs. Tests here are long runs under the `fault` marker (scripts/fault)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.conftest import cluster, roles_redis_url
from tests.support.faketime import FaketimeMissing
from tests.support.faketime import libfaketime as find_libfaketime

__all__ = ["cluster", "libfaketime", "roles_redis_url"]


@pytest.fixture
def libfaketime() -> Path:
    """Path of libfaketime.so.1; a missing library fails the test (never skips it)."""
    try:
        return find_libfaketime()
    except FaketimeMissing as exc:
        pytest.fail(str(exc), pytrace=False)
