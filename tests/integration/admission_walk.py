"""A seeded random walk over upstream admission (`UpstreamGate`, `RunUpstreams`): two
executors' gates over the same Redis keys (on a clock the walk moves, `virtual_time`) and a
real store, checking after every step that nothing an admission took is leaked or given back
twice.

Steps: admit a run to a random list of upstreams (some refuse: a full window, an open
breaker), make a call of a run (its spare admission first, see `UpstreamGate.refresh`), send a
call (its hit re-stamped, or dropped when stale), report a call's outcome, end a run (its
agent ran: `settle`; cancelled: `settle(IGNORE)`; its deadline passed before the agent ran:
`withdraw`), make a gate's next window admission fail as a Redis blip does, and move the
clock.

Invariants: every hit in a window belongs to a call the walk holds or made (an outstanding or
reported call, the spare admission of a run, kept after a run whose agent ran since its
agent may have made the call with HTTP code of its own): no hit of a refused, withdrawn,
stale or failed admission stays; and a half-open breaker's probe count is exactly its
successes plus the current round's probes the walk holds: no probe leaked, none given back
twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random
from typing import Any

from taskstream.agents.upstream_access import CallTicket
from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.store.sql import SqlStore
from taskstream.executor.admission import UpstreamGate
from taskstream.executor.run_upstreams import RunUpstreams
from taskstream.ratelimit.backend import GuardUnavailable
from taskstream.ratelimit.breaker import BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.ratelimit.window import Admission
from tests.ratelimit.guard_watch import expect
from tests.ratelimit.virtual_time import virtual

UPSTREAMS: dict[str, dict[str, Any]] = {
    "a": {"limit": 2, "window": 10.0, "burst": 1},
    "b": {"limit": 3, "window": 30.0, "burst": None},
    "c": {"limit": None, "window": None, "burst": None},
}
LIMITED = ("a", "b")
CONFIG = BreakerConfig(
    failure_threshold=2, min_calls=4, cooldown_ms=4_000, probes=2, probe_timeout_ms=9_000
)
OUTCOMES = (Outcome.SUCCESS, Outcome.SUCCESS, Outcome.FAILURE, Outcome.IGNORE)


class BlipLimiter(RedisLimiter):
    """The Redis limiter, whose next `acquire` fails once `blip` is set, as a blip would:
    after the script ran (its hit recorded, in `lost`) or before, as `after` says."""

    blip = False
    after = False

    def __init__(self, redis: streams.Redis, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.lost: set[str] = set()

    async def acquire(self, name: str, limit: int, window_ms: int, burst: int = 0) -> Admission:
        if not self.blip:
            return await super().acquire(name, limit, window_ms, burst)
        self.blip = False
        if self.after:  # the reply is lost: the hit stays until its window passes
            got = await super().acquire(name, limit, window_ms, burst)
            self.lost |= {got.member} if got.member is not None else set()
        raise GuardUnavailable(f"limiter {name}: connection reset")


@dataclass
class Held:
    """One run the walk holds: its access, its spare admissions, its outstanding calls."""

    access: RunUpstreams
    spares: dict[str, CallTicket]
    calls: list[CallTicket] = field(default_factory=list)
    sent: set[int] = field(default_factory=set)
    touched: bool = False


@dataclass
class Walk:
    rng: Random
    clock: FixedClock
    redis: streams.Redis
    keys: Keys
    gates: list[tuple[UpstreamGate, BlipLimiter, RedisBreakers]]
    runs: list[Held] = field(default_factory=list)
    owned: set[str] = field(default_factory=set)
    """Hits that may stay: of calls held or made, and of spares of runs (ended or not)."""

    def gate(self) -> tuple[UpstreamGate, BlipLimiter, RedisBreakers]:
        return self.rng.choice(self.gates)


async def start(w: Walk) -> None:
    names = w.rng.sample(list(UPSTREAMS), w.rng.randint(1, 3))
    try:
        got = await w.gate()[0].admit_run(names)
    except GuardUnavailable:
        return
    if isinstance(got, RunUpstreams):
        spares = dict(got._spare)
        w.owned |= {t.hit for t in spares.values() if t.hit is not None}
        w.runs.append(Held(got, spares))


async def call(w: Walk) -> None:
    if not w.runs:
        return
    run = w.rng.choice(w.runs)
    name = w.rng.choice(list(UPSTREAMS))
    run.touched = True
    spare = run.spares.pop(name, None)
    try:
        ticket = await run.access.acquire(name)
    except GuardUnavailable:
        ticket = None
    kept = isinstance(ticket, CallTicket) and spare is not None and ticket.hit == spare.hit
    if spare is not None and spare.hit is not None and not kept:
        w.owned.discard(spare.hit)  # replaced or refused: its hit must be gone
    if isinstance(ticket, CallTicket):
        run.calls.append(ticket)
        if ticket.hit is not None:
            w.owned.add(ticket.hit)


async def send(w: Walk) -> None:
    unsent = [(r, t) for r in w.runs for t in r.calls if id(t) not in r.sent]
    if not unsent:
        return
    run, ticket = w.rng.choice(unsent)
    if await run.access.sending(ticket):
        run.sent.add(id(ticket))
    else:  # not sent: the client reports nothing for it, the run's settle will
        run.calls.remove(ticket)
        if ticket.hit is not None:
            w.owned.discard(ticket.hit)


async def report(w: Walk) -> None:
    held = [(r, t) for r in w.runs for t in r.calls]
    if not held:
        return
    run, ticket = w.rng.choice(held)
    run.calls.remove(ticket)
    await run.access.record(ticket, w.rng.choice(OUTCOMES))


async def end(w: Walk) -> None:
    if not w.runs:
        return
    run = w.runs.pop(w.rng.randrange(len(w.runs)))
    pick = w.rng.random()
    if not run.touched and pick < 0.4:  # its deadline passed while it was admitted
        await run.access.withdraw()
        w.owned -= {t.hit for t in run.spares.values() if t.hit is not None}
    elif pick < 0.7:  # cancelled: a stop, a fence
        await run.access.settle(Outcome.IGNORE)
    else:
        await run.access.settle(w.rng.choice(OUTCOMES))


async def blip(w: Walk) -> None:
    limiter = w.gate()[1]
    limiter.blip, limiter.after = True, w.rng.random() < 0.3


async def advance(w: Walk) -> None:
    w.clock.advance(w.rng.choice((1, 300, 2_000, 4_000, 9_000, 11_000, 31_000)))


STEPS = ((start, 20), (call, 20), (send, 14), (report, 14), (end, 12), (blip, 6), (advance, 12))


async def check(w: Walk) -> None:
    lost = {hit for _, limiter, _ in w.gates for hit in limiter.lost}
    for name in LIMITED:
        live = {_text(m) for m in await w.redis.zrange(w.keys.limiter(name), 0, -1)}
        leaked = live - w.owned - lost
        expect(not leaked, f"{name}: hits nobody holds: {sorted(leaked)}")
    breakers = w.gates[0][2]
    for name in UPSTREAMS:
        state = await breakers.state(name)
        if state.status is not BreakerStatus.HALF_OPEN:
            continue
        tickets = [t for r in w.runs for t in (*r.access._open, *r.access._spare.values())]
        held = sum(1 for t in tickets if t.upstream == name and t.probe_round == state.since_ms)
        taken = (state.probes_admitted, state.probe_successes + held)
        expect(taken[0] == taken[1], f"{name}: {taken[0]} probes taken, {taken[1]} held")


async def walk(
    store: SqlStore, redis: streams.Redis, keys: Keys, redis_url: str, seed: int, steps: int
) -> None:
    await store.upsert_upstreams(UPSTREAMS)
    rng, clock = Random(seed), FixedClock(await store.db_now_ms())
    clients = [streams.connect(redis_url) for _ in range(2)]
    gates = []
    for client in clients:
        limiter = BlipLimiter(virtual(client, clock), keys)
        breakers = RedisBreakers(virtual(client, clock), keys)
        gates.append((UpstreamGate(store, limiter, breakers, CONFIG), limiter, breakers))
    w = Walk(rng, clock, redis, keys, gates)
    kinds, weights = zip(*STEPS, strict=True)
    trail: list[str] = []
    try:
        for number in range(steps):
            step = rng.choices(kinds, weights)[0]
            trail = [*trail[-11:], f"{number}: {step.__name__}"]
            try:
                await step(w)
                await check(w)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nseed {seed}\n" + "\n".join(trail)) from exc
    finally:
        for client in clients:
            await client.aclose()


def _text(member: Any) -> str:
    return member.decode() if isinstance(member, bytes) else str(member)
