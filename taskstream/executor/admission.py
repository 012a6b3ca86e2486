"""Admission of a claimed run to its upstreams (DESIGN.md §8): after the claim and before the
agent runs, every upstream the task names must have a closed (or probing) breaker and a free
slot in its shared sliding window. A refused run is deferred (RETRYING at the time the slot or
the breaker frees) without spending an attempt.

During the run the gate is bound as the agent's `UpstreamAccess` (`RunUpstreams`): calls
through the context's HTTP client are admitted and recorded one by one, the first call to a
declared upstream using the run's admission. A call whose failure leaves the breaker open
learns the cool-down left, so the client defers the run instead of spending an attempt on a
known outage. After the run, its outcome is recorded in the breakers of the admissions no
call reported on.

Each upstream's limit and breaker settings are its stored `upstreams:` config (read again every
`RELOAD_S`); an upstream with no stored config, or one stored without `breaker`, uses the
gate's default `BreakerConfig`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from taskstream.agents.upstream_access import CallTicket
from taskstream.core.definitions import UpstreamCache
from taskstream.core.errors import StoreUnavailable
from taskstream.core.futures import detached
from taskstream.core.logging import get_logger
from taskstream.core.store.port import Store
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.backend import Breakers, BreakerUpdate, GuardUnavailable, Limiter
from taskstream.ratelimit.breaker import (
    BreakerState,
    BreakerStatus,
    Outcome,
    Transition,
    cooldown_left_ms,
    refused_wait_ms,
)
from taskstream.ratelimit.breaker_config import BreakerConfig, upstream_breaker_config
from taskstream.ratelimit.window import Limits, guarded, limits_from_spec

RELOAD_S = 10.0
"""How often stored upstream limits and breaker settings are read again (seconds)."""
GIVE_BACK_S = 2.0
"""Longest wait for what an admission that raised or was cancelled took to be given back (s)."""


def open_left_ms(state: BreakerState, now_ms: int, cfg: BreakerConfig) -> int:
    """How long (ms, >= 1) to defer a run whose failed call found `state` at `now_ms` (the
    breaker's clock): until the cool-down of an open breaker ends, else 1 (its cool-down is
    over, the next admission decides)."""
    return max(1, cooldown_left_ms(state, now_ms, cfg))


def admission_holds(state: BreakerState, probe_round: int | None) -> bool:
    """Whether a call admitted as `probe_round` (None: an ordinary call) may still go out on
    that admission with the breaker in `state`: an ordinary one while it is closed, a probe
    while its round (the half-open `since_ms`) is the current one."""
    if probe_round is None:
        return state.status is BreakerStatus.CLOSED
    return state.status is BreakerStatus.HALF_OPEN and state.since_ms == probe_round


class UpstreamGate:
    """Limiter and breaker checks for one executor process.

    `config` is the breaker setting of upstreams that have none stored (default
    `BreakerConfig()`); stored ones override it per upstream.
    """

    def __init__(
        self,
        store: Store,
        limiter: Limiter,
        breakers: Breakers,
        config: BreakerConfig | None = None,
        reload_s: float = RELOAD_S,
    ) -> None:
        self._limiter, self._breakers = limiter, breakers
        self._default = config or BreakerConfig()
        self._upstreams = UpstreamCache(store, min_interval_s=reload_s)
        self._limits: dict[str, Limits] = {}
        self._configs: dict[str, BreakerConfig] = {}
        self._log = get_logger(role="executor")

    async def _reload(self) -> None:
        """Read the upstreams' settings again (at most every `reload_s`). Once they have
        been read, a store that does not answer keeps the last ones (as `BreakerHolds`
        does): a blip must not fail a run's call, nor count against its upstreams."""
        try:
            read = await self._upstreams.refresh()
        except StoreUnavailable as exc:
            if not self._upstreams.loaded:
                raise
            self._log.warning("upstream.settings_kept", error=str(exc)[:300])
            return
        if not read:
            return
        for name, reason in self._upstreams.invalid.items():
            self._log.warning("upstream.config_invalid", upstream=name, reason=reason)
        specs = self._upstreams.specs
        limits = {name: limits_from_spec(spec) for name, spec in specs.items()}
        # Guarded: arrivals at the upstream, not only admissions, respect the limit.
        self._limits = {name: guarded(lim) for name, lim in limits.items() if lim is not None}
        self._configs = {
            name: upstream_breaker_config(spec, self._default) for name, spec in specs.items()
        }

    def config(self, name: str) -> BreakerConfig:
        """The breaker settings `name` is admitted and recorded with (as last loaded)."""
        return self._configs.get(name, self._default)

    async def admit_run(self, upstreams: Sequence[str]) -> int | RunUpstreams:
        """The run's `UpstreamAccess` when it may call every upstream now (its first call to
        each uses this admission, and moves its hit to when it is sent); else the wait (ms)
        before retrying. A refusal hands back what this call took for the upstreams before
        the refusing one, since no call goes out: their half-open probes (a kept one would
        refuse everyone else until its `probe_timeout_ms` passed) and their window slots (a
        kept one would count until its window passed, for a call never sent). Each is given
        back once, and a cancellation meanwhile does not cut that short (`_give_back`)."""
        probes: dict[str, int] = {}
        hits: dict[str, str] = {}
        wait_ms: int | None = None
        try:
            for name in upstreams:
                wait_ms, probe_round, hit = await self._admit(name)
                if wait_ms is not None:
                    break
                if probe_round is not None:
                    probes[name] = probe_round
                if hit is not None:
                    hits[name] = hit
        except BaseException:  # undecided (Redis, the store) or cancelled: no call goes out
            await self._give_back(probes, hits)
            raise
        if wait_ms is None:
            return RunUpstreams(self, upstreams, hits, probes)
        await self._give_back(probes, hits)
        return wait_ms

    async def _hand_back(self, probes: Mapping[str, int], hits: Mapping[str, str]) -> None:
        """Give back what an admission took for calls that will not go out (`probes`: the
        round of each probe taken, by upstream). Best effort: a probe that cannot be given
        back is presumed lost after its `probe_timeout_ms`."""
        for taken, probe_round in probes.items():
            cfg = self.config(taken)
            try:
                await self._breakers.record(taken, Outcome.IGNORE, cfg, probe_round=probe_round)
            except GuardUnavailable as exc:
                self._log.warning(
                    "upstream.probe_return_failed", upstream=taken, error=str(exc)[:300]
                )
        for name, hit in hits.items():
            try:
                await self._limiter.release(name, hit)
            except GuardUnavailable as exc:  # the slot then counts until its window passes
                self._log.warning("upstream.release_failed", upstream=name, error=str(exc)[:300])

    async def give_back(self, tickets: Sequence[CallTicket]) -> None:
        """Give back what `tickets` (one per upstream) took, for calls that will not go out:
        their half-open probes and their window slots, as `_give_back` does."""
        probes = {t.upstream: t.probe_round for t in tickets if t.probe_round is not None}
        hits = {t.upstream: t.hit for t in tickets if t.hit is not None}
        await self._give_back(probes, hits)

    async def _give_back(self, probes: Mapping[str, int], hits: Mapping[str, str]) -> None:
        """`_hand_back` for an admission whose call will not go out (refused, or it raised
        or was cancelled: a stop, a fence): shielded, so a cancellation does not cut it
        short, and within `GIVE_BACK_S` (what is not given back by then frees by itself, as
        after an outage)."""
        if not probes and not hits:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.shield(detached(self._hand_back(probes, hits), GIVE_BACK_S))

    async def admit_call(self, name: str) -> tuple[int | None, str | None, int | None]:
        """Admit one call to `name`: None when it may go now (a breaker probe or a window slot
        is taken), else the wait (ms, >= 1) before asking again; the call's hit in the
        window, if the upstream has a limit; and the round of the half-open probe it goes as,
        if it does (`BreakerDecision.probe_round`)."""
        wait_ms, probe_round, hit = await self._admit(name)
        return wait_ms, hit, probe_round

    async def restamp(self, name: str, hit: str) -> bool:
        """The call of `hit` is being sent: move the hit to now (see `window`). False when it
        is stale and the call must not go out. When the limiter cannot be reached the call
        goes as admitted (its hit counts from its admission, as before re-stamping)."""
        limits = self._limits.get(name)
        if limits is None:
            return True
        try:
            return await self._limiter.restamp(name, hit, limits.window_ms)
        except GuardUnavailable as exc:
            self._log.warning("upstream.restamp_failed", upstream=name, error=str(exc)[:300])
            return True

    async def _admit(self, name: str) -> tuple[int | None, int | None, str | None]:
        """`admit_call`'s answer: the wait, the round of the probe taken for the call, the hit."""
        await self._reload()
        cfg = self.config(name)
        decision = await self._breakers.admit(name, cfg)
        self._changed(name, decision.transition)
        if not decision.allowed:
            wait_ms = refused_wait_ms(decision, cfg)
            self._log.info("upstream.breaker_refused", upstream=name, retry_after_ms=wait_ms)
            return wait_ms, None, None
        limits = self._limits.get(name)
        if limits is None:
            return None, decision.probe_round, None
        taken = {} if decision.probe_round is None else {name: decision.probe_round}
        try:
            admission = await self._limiter.acquire(name, *limits)
        except BaseException:
            await self._give_back(taken, {})  # no call goes out: the probe slot goes back
            raise
        if not admission.allowed:
            self._log.info(
                "upstream.limited", upstream=name, retry_after_ms=admission.retry_after_ms
            )
            await self._give_back(taken, {})
            return max(1, admission.retry_after_ms), None, None
        return None, decision.probe_round, admission.member

    async def record_call(
        self, name: str, outcome: Outcome, *, probe_round: int | None
    ) -> int | None:
        """Record one call's `outcome` in `name`'s breaker (`probe_round`: the round of the
        half-open probe it was admitted as, if it was). A failure that leaves the breaker
        open (it tripped it, a probe failed, or the call was in flight when it opened)
        returns the cool-down left (ms, >= 1): the outage is known, so the run is to be
        deferred until then. Anything else returns None."""
        cfg = self.config(name)
        update = await self._breakers.record(name, outcome, cfg, probe_round=probe_round)
        self._changed(name, update.transition)
        if outcome is not Outcome.FAILURE or update.state.status is not BreakerStatus.OPEN:
            return None
        return await self._cooldown_left(name, update, cfg)

    async def _cooldown_left(self, name: str, update: BreakerUpdate, cfg: BreakerConfig) -> int:
        if update.transition is Transition.OPENED:  # opened by this failure: all of it is left
            return cfg.cooldown_ms
        try:  # already open: measure what is left on the breakers' own clock
            read = await self._breakers.states([name])
        except GuardUnavailable:
            return cfg.cooldown_ms
        return open_left_ms(read.states[name], read.at_ms, cfg)

    def _changed(self, name: str, transition: Transition | None) -> None:
        if transition is not None:
            self._log.warning("upstream.breaker", upstream=name, transition=transition)

    async def refresh(self, ticket: CallTicket) -> CallTicket | int:
        """A run's own admission, about to go out as its first call to the upstream (the
        agent may have worked a long time since): its ticket when it still holds, else the
        call admitted anew (what the old admission took given back), or the wait (ms).

        It no longer holds when its breaker has left the state that admitted it (see
        `_holds`): its call must not go into an outage, nor beside a newer round's probes.
        Its window hit that went stale (older than the window allows to move) is replaced
        by a new one: a run whose agent works longer than the window before calling must not
        be deferred for ever."""
        name = ticket.upstream
        if not await self._holds(ticket):
            await self._give_back({}, {} if ticket.hit is None else {name: ticket.hit})
            wait_ms, probe_round, hit = await self._admit(name)
            return wait_ms if wait_ms is not None else CallTicket(name, probe_round, hit)
        limits = self._limits.get(name)
        if ticket.hit is None or limits is None or await self.restamp(name, ticket.hit):
            return ticket
        probe = {} if ticket.probe_round is None else {name: ticket.probe_round}
        try:
            admission = await self._limiter.acquire(name, *limits)
        except BaseException:
            await self._give_back(probe, {})  # no call goes out: its probe goes back
            raise
        if admission.allowed:
            return CallTicket(name, ticket.probe_round, admission.member)
        await self._give_back(probe, {})
        return max(1, admission.retry_after_ms)

    async def _holds(self, ticket: CallTicket) -> bool:
        """The breaker is still in the state that admitted `ticket` (or cannot be read: the
        call goes as admitted): closed for an ordinary admission; half-open in the same
        round for a probe. A probe whose round has ended (the breaker re-opened, closed, or
        handed its slots out again) has no slot any more, and nothing to give back."""
        name = ticket.upstream
        try:
            read = await self._breakers.states([name])
        except GuardUnavailable as exc:
            self._log.warning("upstream.breaker_unread", upstream=name, error=str(exc)[:300])
            return True
        return admission_holds(read.states[name], ticket.probe_round)

    def bind(self, admitted: Sequence[str]) -> RunUpstreams:
        """The gate as one run's `UpstreamAccess`; `admitted` are the upstreams `admit_run` has
        already let this run call once, with no hit to move when those calls are sent (a run
        with no upstreams, or callers that admit calls one by one); `admit_run` binds a run's
        own admission."""
        return RunUpstreams(self, admitted, {})
