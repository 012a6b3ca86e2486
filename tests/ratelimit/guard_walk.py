"""A seeded random walk over the shared limiter and breakers (DESIGN.md §8): several
`RedisLimiter` / `RedisBreakers` pairs, each on its own connection as separate executors
are, over the same keys of real Redis, on one clock the walk moves (`virtual_time`).

Steps: admit a call (alone, or several executors at the same moment), release a hit, send a
call (re-stamp its hit), read usage, ask a breaker (alone or several at once), report a
call's outcome (from an HTTP status or a timeout, `classify_http`), a gate-like call (breaker,
then limiter, the probe given back when the limiter refuses), and move the clock (a little,
to the next edge of a window, cool-down or probe timeout, or far).

Checked after every step: every answer against `guard_watch` (a slot is free exactly when
the caps allow, a refusal's wait is exact, a released or stale hit holds no slot; an open
breaker admits nothing until its cool-down ends, then only `probes` calls per round, every
move is one the state machine allows) and against the pure rules of `breaker`; no span of
one window of the calls admitted and not given back holds more than `limit + burst`, none of
two windows more than `2 * limit`; the stored breaker state is the expected one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from random import Random

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.ratelimit import breaker
from taskstream.ratelimit.breaker import BreakerDecision, BreakerState, Outcome, classify_http
from taskstream.ratelimit.breaker_config import BreakerConfig
from taskstream.ratelimit.redis_backend import RedisBreakers, RedisLimiter
from taskstream.ratelimit.window import Admission, Limits
from tests.ratelimit.guard_watch import BreakerWatch, WindowWatch, expect
from tests.ratelimit.virtual_time import virtual
from tests.support.keyspace import drop_keys

EXECUTORS = 3
NAMES = ("a", "b")
START_MS = 1_700_000_000_000
STATUSES = (200, 204, 302, 400, 404, 429, 500, 503, None)


@dataclass(frozen=True)
class Ticket:
    """An admitted breaker call not reported yet."""

    id: int
    name: str
    probe_round: int | None


@dataclass
class Guard:
    """One executor's backends."""

    limiter: RedisLimiter
    breakers: RedisBreakers


@dataclass
class World:
    rng: Random
    clock: FixedClock
    guards: list[Guard]
    limits: dict[str, Limits]
    configs: dict[str, BreakerConfig]
    windows: dict[str, WindowWatch] = field(default_factory=dict)
    watches: dict[str, BreakerWatch] = field(default_factory=dict)
    pure: dict[str, BreakerState] = field(default_factory=dict)
    tickets: list[Ticket] = field(default_factory=list)
    made: int = 0

    def guard(self) -> Guard:
        return self.rng.choice(self.guards)

    def name(self) -> str:
        return self.rng.choice(NAMES)

    def now(self) -> int:
        return self.clock.now_ms()


def _limits(rng: Random) -> Limits:
    return Limits(rng.randint(1, 4), rng.choice((5_000, 10_000, 30_000)), rng.randint(0, 2))


def _config(rng: Random) -> BreakerConfig:
    return BreakerConfig(
        failure_threshold=rng.randint(1, 4),
        failure_rate=rng.choice((0.25, 0.5, 1.0)),
        window_ms=rng.choice((5_000, 20_000)),
        min_calls=rng.randint(1, 6),
        cooldown_ms=rng.choice((1_000, 7_000)),
        probes=rng.randint(1, 3),
        probe_timeout_ms=rng.choice((2_000, 9_000)),
    )


async def acquire(w: World) -> None:
    name = w.name()
    await _acquired(w, name, [await w.guard().limiter.acquire(name, *w.limits[name])])


async def acquire_many(w: World) -> None:
    """Several executors ask at the same moment: exactly the free slots are given."""
    name = w.name()
    asks = [g.limiter.acquire(name, *w.limits[name]) for g in w.guards]
    await _acquired(w, name, list(await asyncio.gather(*asks)))


async def _acquired(w: World, name: str, answers: list[Admission]) -> None:
    watch, now = w.windows[name], w.now()
    room = watch.room(now)
    allowed = [a for a in answers if a.allowed]
    expect(len(allowed) == min(room, len(answers)), f"{len(allowed)} admitted, {room} free")
    for answer in allowed:  # recorded first: a refusal's wait counts every hit given now
        watch.admitted(answer.member, now)
    for answer in answers:
        if not answer.allowed:
            watch.refused(answer.retry_after_ms, now)


async def release(w: World) -> None:
    name = w.name()
    watch = w.windows[name]
    member = w.rng.choice([*watch.stamps, "0:never"])
    await w.guard().limiter.release(name, member)
    watch.stamps.pop(member, None)


async def send(w: World) -> None:
    name = w.name()
    watch = w.windows[name]
    newest = sorted(watch.stamps, key=watch.stamps.__getitem__)[-2:]
    member = w.rng.choice([*watch.stamps, *newest, *newest, "0:never"])
    moved = await w.guard().limiter.restamp(name, member, w.limits[name].window_ms)
    watch.restamped(member, moved, w.now())


async def usage(w: World) -> None:
    name = w.name()
    got = await w.guard().limiter.usage(name, w.limits[name].window_ms)
    watch, now = w.windows[name], w.now()
    expect(got.at_ms == now, f"usage read at {got.at_ms}, not {now}")
    seen = (got.used, got.in_horizon)
    expect(seen == (watch.in_window(now), watch.in_horizon(now)), f"usage {seen}")


async def admit(w: World, name: str | None = None) -> BreakerDecision:
    name = name or w.name()
    decision = await w.guard().breakers.admit(name, w.configs[name])
    _admitted(w, name, [decision])
    return decision


async def admit_many(w: World) -> None:
    name = w.name()
    asks = [g.breakers.admit(name, w.configs[name]) for g in w.guards]
    _admitted(w, name, list(await asyncio.gather(*asks)))


def _admitted(w: World, name: str, decisions: list[BreakerDecision]) -> None:
    """Check answers given at one moment (any order) and keep a ticket for each call let
    through."""
    want: list[BreakerDecision] = []
    for _ in decisions:
        decision, w.pure[name] = breaker.admit(w.pure[name], w.now(), w.configs[name])
        want.append(decision)
    got_sorted, want_sorted = sorted(decisions, key=_order), sorted(want, key=_order)
    expect(got_sorted == want_sorted, f"admit answered {got_sorted}, the rules {want_sorted}")
    for decision in want:  # in the order the rules give them: the watch follows that order
        w.made += 1
        w.watches[name].admitted(decision, w.made, w.now())
        if decision.allowed:
            w.tickets.append(Ticket(w.made, name, decision.probe_round))


def _order(d: BreakerDecision) -> tuple[object, ...]:
    return (d.allowed, d.probe_round or 0, d.retry_after_ms, d.transition or "")


async def report(w: World, ticket: Ticket | None = None, outcome: Outcome | None = None) -> None:
    if ticket is None:
        if not w.tickets:
            return
        ticket = w.tickets.pop(w.rng.randrange(len(w.tickets)))
    if outcome is None:
        outcome = classify_http(w.rng.choice(STATUSES), w.rng.random() < 0.1)
    name, cfg, probe_round = ticket.name, w.configs[ticket.name], ticket.probe_round
    update = await w.guard().breakers.record(name, outcome, cfg, probe_round=probe_round)
    w.pure[name] = breaker.record(w.pure[name], outcome, w.now(), cfg, probe_round=probe_round)
    expect(update.state == w.pure[name], f"record gave {update.state}, the rules {w.pure[name]}")
    w.watches[name].recorded(ticket.id, probe_round, outcome, update.state)


async def call(w: World) -> None:
    """As an executor admits a call: the breaker, then the window; a refused window gives
    the probe back, as saying nothing."""
    name = w.name()
    decision = await admit(w, name)
    if not decision.allowed:
        return
    ticket = w.tickets.pop()
    admission = await w.guard().limiter.acquire(name, *w.limits[name])
    await _acquired(w, name, [admission])
    if admission.allowed:
        w.tickets.append(ticket)
    else:
        await report(w, ticket, Outcome.IGNORE)


async def advance(w: World) -> None:
    """A little, to just before or at one of the next edges of a window, cool-down or probe
    timeout, or far."""
    now = w.now()
    edges = [
        t + span
        for name, watch in w.windows.items()
        for t in watch.stamps.values()
        for span in (w.limits[name].window_ms, 2 * w.limits[name].window_ms)
    ]
    for name, state in w.pure.items():
        cfg = w.configs[name]
        edges += [state.since_ms + cfg.cooldown_ms, state.last_probe_ms + cfg.probe_timeout_ms]
        edges += [state.since_ms + cfg.probe_timeout_ms]
    later = sorted(t for t in edges if t > now)[:3]
    pick = w.rng.random()
    if later and pick < 0.6:
        w.clock.set(w.rng.choice(later) - w.rng.choice((0, 0, 1)))
    elif pick < 0.9:
        w.clock.advance(w.rng.choice((1, 50, 400, 1_500)))
    else:
        w.clock.advance(61_000)


Step = Callable[[World], Awaitable[object]]
STEPS: tuple[tuple[Step, int], ...] = (
    (acquire, 14),
    (acquire_many, 4),
    (release, 5),
    (send, 7),
    (usage, 3),
    (admit, 12),
    (admit_many, 4),
    (report, 16),
    (call, 12),
    (advance, 18),
)


async def check(w: World) -> None:
    for name in NAMES:
        w.windows[name].check()
        stored = await w.guard().breakers.state(name)
        expect(stored == w.pure[name], f"{name} stored {stored}, the rules {w.pure[name]}")
        w.watches[name].check(stored)


@asynccontextmanager
async def world(redis_url: str, keys: Keys, seed: int) -> AsyncIterator[World]:
    """`EXECUTORS` backend pairs on their own connections, on one clock of the walk's."""
    rng, clock = Random(seed), FixedClock(START_MS)
    clients = [streams.connect(redis_url) for _ in range(EXECUTORS)]
    guards = [
        Guard(RedisLimiter(virtual(c, clock), keys), RedisBreakers(virtual(c, clock), keys))
        for c in clients
    ]
    limits = {name: _limits(rng) for name in NAMES}
    configs = {name: _config(rng) for name in NAMES}
    w = World(rng, clock, guards, limits, configs)
    for name in NAMES:
        w.windows[name] = WindowWatch(limits[name])
        w.watches[name] = BreakerWatch(configs[name])
        w.pure[name] = BreakerState()
    try:
        yield w
    finally:
        await drop_keys(clients[0], keys)
        for client in clients:
            await client.aclose()


async def walk(redis_url: str, keys: Keys, seed: int, steps: int) -> None:
    """`steps` random steps of seed `seed`, every invariant checked after each."""
    async with world(redis_url, keys, seed) as w:
        kinds, weights = zip(*STEPS, strict=True)
        trail: list[str] = []
        for number in range(steps):
            step = w.rng.choices(kinds, weights)[0]
            trail = [*trail[-11:], f"{number}: {step.__name__} at +{w.now() - START_MS} ms"]
            try:
                await step(w)
                await check(w)
            except AssertionError as exc:
                where = f"seed {seed}, limits {w.limits}, breakers {w.configs}"
                raise AssertionError(f"{exc}\n{where}\n" + "\n".join(trail)) from exc
