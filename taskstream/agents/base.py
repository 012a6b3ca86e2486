"""The agent contract: what an agent is given and what it may raise."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from pydantic import BaseModel

from taskstream.agents.upstream import UpstreamClient
from taskstream.core.markers import is_business_date, is_marker_name
from taskstream.core.store.tables import KEY_LEN


async def _nothing_done(_key: str) -> bool:
    return False


async def _no_markers(_name: str, _business_date: str) -> bool:
    raise RuntimeError("this context cannot set readiness markers")


@dataclass(slots=True)
class AgentContext:
    """What a run knows about itself.

    `attempt` is the fencing token of this run; `idempotency_key` is stable across attempts of
    one instance (the dedupe key), so side effects keyed on it happen at most once.
    `side_effects` collects the keys passed to `once` (less those given to `forget`); they are
    committed with the run's final status, whatever it is, in one transaction, so a fenced run
    commits none of them.
    `upstreams` are the upstream names the task declares (first = the main one); `http` is the
    limiter- and breaker-aware HTTP client for calling them (`agents.upstream`). A context
    built without one gets a client that admits every call and records nothing.
    """

    instance_id: str
    task_id: str
    attempt: int
    idempotency_key: str
    scheduled_for_ms: int
    log: structlog.typing.FilteringBoundLogger
    record: dict[str, Any] = field(default_factory=dict)
    side_effects: list[str] = field(default_factory=list)
    effect_done: Callable[[str], Awaitable[bool]] = _nothing_done
    business_date: str | None = None
    set_marker: Callable[[str, str], Awaitable[bool]] = _no_markers
    upstreams: tuple[str, ...] = ()
    http: UpstreamClient = field(default_factory=UpstreamClient)
    checking: set[str] = field(default_factory=set)
    """Keys a call of `once` is asking the store about: not handed out yet."""

    async def mark_ready(self, name: str, business_date: str | None = None) -> bool:
        """Set the readiness marker `name` (e.g. `raw_data.ready`) for a business date (this
        run's by default), releasing ticks of tasks that `depends_on` it. False when it was
        already set. Fenced like the run's commit: `ClaimLost` when this run's lease lapsed
        and its instance moved on, and the marker is not set. `ValueError`, and nothing set,
        when no task could wait for it, as `taskstream mark` refuses: a `name` that no
        `depends_on` may list, or a date not written `YYYY-MM-DD` (the scheduler's form)."""
        day = business_date or self.business_date
        if day is None:
            raise ValueError("no business date: pass one explicitly")
        if not is_marker_name(name):
            raise ValueError(f"{name!r} is not a marker name (as depends_on lists them)")
        if not is_business_date(day):
            raise ValueError(f"{day!r} is not a business date (YYYY-MM-DD)")
        return await self.set_marker(name, day)

    async def once(self, key: str) -> bool:
        """True when the side effect named `key` should be performed by this run: no earlier
        run of any instance has committed it, and no other call of this run was handed it or
        is asking the store about it. The key is committed with this run's outcome. A full
        key (`idempotency_key:key`) longer than the store keeps (`KEY_LEN`) is stored as
        `sha256:` and its hex digest, so a long dedupe key or name cannot fail the commit."""
        full = effect_key(self.idempotency_key, key)
        if full in self.side_effects or full in self.checking:
            return False
        # Held while the store is asked: a concurrent call of this run for the same key (an
        # agent fanning out) must not be handed the effect too.
        self.checking.add(full)
        try:
            if await self.effect_done(full):
                return False
        finally:
            self.checking.discard(full)
        self.side_effects.append(full)
        return True

    def forget(self, key: str) -> None:
        """The side effect named `key`, which `once` let this run perform, did not happen (its
        call was refused before the other side acted on it): its key is not committed with
        this run, so a later attempt performs it. A key the agent does not forget is
        committed whatever the run's outcome: an effect that happened before a later failure
        must not happen again. A key `once` did not hand out is left as it is."""
        full = effect_key(self.idempotency_key, key)
        if full in self.side_effects:
            self.side_effects.remove(full)


def effect_key(idempotency_key: str, name: str) -> str:
    """The stored key of the side effect `name` of the instance with `idempotency_key`: the
    two joined by `:`, or `sha256:` and its digest when that is longer than the store keeps
    (`KEY_LEN`), is not UTF-8 (a lone surrogate, from bytes decoded with `surrogateescape`)
    or holds a NUL, which MariaDB or PostgreSQL would refuse at the commit, after the effect."""
    full = f"{idempotency_key}:{name}"
    if len(full) <= KEY_LEN and "\x00" not in full and _is_utf8(full):
        return full
    return "sha256:" + hashlib.sha256(full.encode("utf-8", "surrogatepass")).hexdigest()


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Agent(Protocol):
    """An agent: a name, a pydantic params model, the upstreams it calls, and a run function."""

    @property
    def name(self) -> str: ...

    @property
    def params_model(self) -> type[BaseModel]: ...

    @property
    def upstreams(self) -> tuple[str, ...]: ...

    async def run(self, ctx: AgentContext, params: BaseModel) -> Any: ...


RunFn = Callable[[AgentContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class FunctionAgent:
    """An `Agent` made from a plain async function and its params model."""

    name: str
    params_model: type[BaseModel]
    fn: RunFn
    upstreams: tuple[str, ...] = ()

    async def run(self, ctx: AgentContext, params: BaseModel) -> Any:
        return await self.fn(ctx, params)
