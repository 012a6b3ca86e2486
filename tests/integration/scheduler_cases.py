"""Shared parts of the scheduler tests: the fire times M0 and DAY0, task files with a marker
dependency and with an overlap policy, and `make`, a scheduler over a harness."""

from __future__ import annotations

from taskstream.scheduler.leader import LeaderLease
from taskstream.scheduler.service import Scheduler, SchedulerConfig
from tests.integration.harness import Harness

M0 = 1_780_000_020_000
"""A whole minute (epoch ms), so `every: 1m` fires at M0 + k minutes."""


def make(h: Harness, owner: str | None = None, lease_ms: int = 10_000) -> Scheduler:
    lease = LeaderLease(h.redis, h.keys, owner, lease_ms=lease_ms) if owner else None
    return Scheduler(h.store, h.outbox, h.clock, SchedulerConfig(), leader=lease)


DAY0 = 1_780_012_800_000
"""2026-05-29T00:00:00Z."""


DEPS = """
tasks:
  - id: report
    agent: echo
    schedule: {every: 1m}
    window: 10m
    depends_on: [raw.ready]
"""


OVERLAP = """
tasks:
  - {{id: job, agent: echo, schedule: {{every: 1m}}, window: 10m, concurrency: {policy}}}
"""
