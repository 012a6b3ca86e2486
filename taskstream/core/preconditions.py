"""Preconditions: named readiness checks that modules provide, evaluated by the scheduler.

A module listed in `TASKSTREAM_PRECONDITION_MODULES` exposes `PRECONDITIONS`, a mapping of
name -> async callable `(task_id, business_date) -> "pass" | "fail" | "unavailable"`. A check
that raises, times out or returns anything else counts as "unavailable" (the tick waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, cast

from taskstream.core.errors import ConfigError
from taskstream.core.plugins import import_named

CheckResult = Literal["pass", "fail", "unavailable"]
Check = Callable[[str, str], Awaitable[str]]
CHECK_TIMEOUT_S = 5.0


def load(modules: Sequence[str]) -> dict[str, Check]:
    """Checks of every module, by name; a module that cannot be used is a `ConfigError`."""
    checks: dict[str, Check] = {}
    for name in modules:
        module = import_named("precondition", name)
        found = getattr(module, "PRECONDITIONS", None)
        if not isinstance(found, Mapping):
            raise ConfigError([f"precondition module {name!r} has no PRECONDITIONS mapping"])
        checks.update(cast(Mapping[str, Check], found))
    return checks


async def evaluate(
    checks: Mapping[str, Check], names: Sequence[str], task_id: str, business_date: str
) -> dict[str, CheckResult]:
    """Run the named checks concurrently, each bounded by `CHECK_TIMEOUT_S`."""
    results = await asyncio.gather(*(_one(checks.get(n), task_id, business_date) for n in names))
    return dict(zip(names, results, strict=True))


async def _one(check: Check | None, task_id: str, business_date: str) -> CheckResult:
    if check is None:
        return "unavailable"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            got = await check(task_id, business_date)
    except Exception:  # a failing check means "cannot tell yet", never a crash
        return "unavailable"
    return cast(CheckResult, got) if got in ("pass", "fail", "unavailable") else "unavailable"
