"""What an executor process is made of: its consumer name, its settings and the services it
talks to."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from random import Random

from taskstream.agents.registry import Registry
from taskstream.core import streams
from taskstream.core.clock import Clock, SystemClock
from taskstream.core.protocol import Keys
from taskstream.core.store.port import Store
from taskstream.executor.admission import UpstreamGate


def consumer_name(start_ms: int) -> str:
    """Unique per process: `host:pid:start`."""
    return f"{socket.gethostname()}:{os.getpid()}:{start_ms}"


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """`concurrency`: runs at once; `block_ms`: longest blocking read; `grace_s`: how long
    in-flight runs may take to finish after stop; `liveness_ttl_s`: how long after its last
    heartbeat a silent process counts as gone."""

    consumer: str
    concurrency: int = 4
    block_ms: int = 1000
    grace_s: float = 8.0
    max_payload_bytes: int = 256 * 1024
    liveness_ttl_s: float = 6.0


@dataclass(frozen=True, slots=True)
class ExecutorDeps:
    """What an executor talks to. `clock` should follow the database clock."""

    store: Store
    redis: streams.Redis
    keys: Keys
    registry: Registry
    clock: Clock = field(default_factory=SystemClock)
    rng: Random = field(default_factory=Random)
    gate: UpstreamGate | None = None
    """Limiter and breaker admission for tasks that name `upstreams` (None: no admission)."""
