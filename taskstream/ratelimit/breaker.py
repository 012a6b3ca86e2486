"""Circuit breaker state machine, as pure functions of (state, now, config).

States and rules (times are UTC epoch ms; `cfg` is a `BreakerConfig`):

- **closed**: every call is admitted. Each counted outcome updates a tumbling window of
  `window_ms` that starts at the first outcome recorded after the previous one ended. After
  each counted outcome the breaker opens when `consecutive_failures >= failure_threshold`, or
  when the window holds `>= min_calls` outcomes of which `failures >= failure_rate * calls`
  (compared in millionths, as integers).
  A success resets `consecutive_failures`.
- **open**: calls are rejected until `since_ms + cooldown_ms`; the first admission at or after
  that moves to half-open. Outcomes recorded while open (calls admitted before it opened)
  change nothing.
- **half_open**: exactly `probes` calls are admitted; the rest are rejected. Only the outcomes
  of the current round's probes count: the breaker closes once `probes` probe successes have
  been recorded and re-opens on any probe failure; an ignored probe gives its slot back.
  Outcomes of calls admitted before (while closed) change nothing. When no probe has been
  admitted for `probe_timeout_ms` (`last_probe_ms`, else since the round began) and probes
  are still out, they are presumed lost and their slots handed out again (successes already
  recorded stay), which starts a new round. A slot an ignored probe gave back goes to the next
  probe of the same round, and that probe too gets its whole `probe_timeout_ms`. When
  `probes` is lowered to no more than the successes already recorded, the next admission
  closes the breaker (its slots, handed out again, would all be held by those successes,
  and no probe could ever be admitted to decide it).
- **rounds**: a round is named by its `since_ms`, set when the breaker half-opens and when
  slots are handed out again; a probe carries the round that admitted it (`probe_round`). A
  probe that reports after its round ended (its slot was handed out again, or the breaker has
  closed or opened since) changes nothing while half-open, so it can neither free a newer
  probe's slot nor close or re-open the breaker on its own stale call.

Opening, half-opening and closing each start from a fresh state (all counters 0,
`since_ms = window_start_ms = now`). Outcomes are attributed to the state current when they are
recorded (and, while half-open, only a current probe's). `classify_http` maps an HTTP result to an
outcome: failures are what the upstream's health is judged by, and "ignore" counts neither way.
`BreakerConfig` and how a task file's `breaker:` settings become one are in `breaker_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from taskstream.ratelimit.breaker_config import BreakerConfig


class BreakerStatus(StrEnum):
    """Where the breaker is."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(StrEnum):
    """The result of one admitted call, as the breaker counts it."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORE = "ignore"


class Transition(StrEnum):
    """A status change, named for events and metrics."""

    OPENED = "opened"
    HALF_OPENED = "half_open"
    CLOSED = "closed"


_TRANSITION_INTO = {
    BreakerStatus.OPEN: Transition.OPENED,
    BreakerStatus.HALF_OPEN: Transition.HALF_OPENED,
    BreakerStatus.CLOSED: Transition.CLOSED,
}


@dataclass(frozen=True, slots=True)
class BreakerState:
    """Everything the breaker remembers; field names double as the Redis hash fields.

    `since_ms`: when the status last changed (half-open: when probe slots were last handed
    out, which names the round). `window_*`: the closed-state tumbling window.
    `probes_admitted` >= 0 and `probe_successes` < `cfg.probes` while half-open, and
    `last_probe_ms`, when the newest probe was admitted (0: none yet, or a state stored before
    it was kept); all counters are 0 in other states except the closed-state ones.
    """

    status: BreakerStatus = BreakerStatus.CLOSED
    since_ms: int = 0
    consecutive_failures: int = 0
    window_start_ms: int = 0
    window_calls: int = 0
    window_failures: int = 0
    probes_admitted: int = 0
    probe_successes: int = 0
    last_probe_ms: int = 0


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    """Whether one call may go to the upstream now.

    `probe_round` is set for a half-open trial call: the round that admitted it (the
    half-open state's `since_ms`), to be passed back to `record`. `retry_after_ms` (0 when
    allowed) is when to ask again: the end of the cool-down, or of the current probes'
    timeout. `transition` is set when this admission changed the status.
    """

    allowed: bool
    probe_round: int | None
    retry_after_ms: int
    status: BreakerStatus
    transition: Transition | None

    @property
    def probe(self) -> bool:
        """Whether the call goes as a half-open probe."""
        return self.probe_round is not None


def fresh(status: BreakerStatus, now_ms: int) -> BreakerState:
    """A state that has just entered `status` at `now_ms`, with every counter at 0."""
    return BreakerState(status=status, since_ms=now_ms, window_start_ms=now_ms)


def transition(before: BreakerStatus, after: BreakerStatus) -> Transition | None:
    """The transition from `before` to `after`, or None when the status did not change."""
    return None if before is after else _TRANSITION_INTO[after]


def classify_http(status: int | None, timed_out: bool) -> Outcome:
    """Timeouts, no response (`status` None), 429 and 5xx are failures; other 4xx and
    anything outside 200-599 are ignored; 2xx and 3xx are successes."""
    if timed_out or status is None or status == 429 or 500 <= status <= 599:
        return Outcome.FAILURE
    if 200 <= status <= 399:
        return Outcome.SUCCESS
    return Outcome.IGNORE


def _decision(
    before: BreakerStatus, after: BreakerState, *, probe: bool, retry_after_ms: int = 0
) -> BreakerDecision:
    return BreakerDecision(
        allowed=retry_after_ms == 0,
        probe_round=after.since_ms if probe else None,
        retry_after_ms=retry_after_ms,
        status=after.status,
        transition=transition(before, after.status),
    )


def cooldown_ends_ms(state: BreakerState, cfg: BreakerConfig) -> int | None:
    """When an open breaker's cool-down ends (ms, the breaker's clock); None unless open."""
    return state.since_ms + cfg.cooldown_ms if state.status is BreakerStatus.OPEN else None


def cooldown_left_ms(state: BreakerState, now_ms: int, cfg: BreakerConfig) -> int:
    """How long (ms) an open breaker keeps refusing calls at `now_ms`, as `admit` applies it.
    0 for a closed or half-open breaker, and for an open one whose cool-down has passed (its
    next admission probes)."""
    ends = cooldown_ends_ms(state, cfg)
    return 0 if ends is None else max(0, ends - now_ms)


def admit(
    state: BreakerState, now_ms: int, cfg: BreakerConfig
) -> tuple[BreakerDecision, BreakerState]:
    """Admit or reject one call at `now_ms`; returns the decision and the state after it."""
    before = state.status
    if state.status is BreakerStatus.CLOSED:
        return _decision(before, state, probe=False), state
    if state.status is BreakerStatus.OPEN:
        if left := cooldown_left_ms(state, now_ms, cfg):
            return _decision(before, state, probe=False, retry_after_ms=left), state
        state = fresh(BreakerStatus.HALF_OPEN, now_ms)
    elif state.probe_successes >= cfg.probes:  # `probes` lowered meanwhile: decided
        state = fresh(BreakerStatus.CLOSED, now_ms)
        return _decision(before, state, probe=False), state
    elif now_ms >= _probes_lost_ms(state, cfg):
        state = replace(state, since_ms=now_ms, probes_admitted=state.probe_successes)
    if state.probes_admitted >= cfg.probes:
        wait = max(1, _probes_lost_ms(state, cfg) - now_ms)
        return _decision(before, state, probe=False, retry_after_ms=wait), state
    state = replace(state, probes_admitted=state.probes_admitted + 1, last_probe_ms=now_ms)
    return _decision(before, state, probe=True), state


def _probes_lost_ms(state: BreakerState, cfg: BreakerConfig) -> int:
    """When a half-open breaker's probes still out are presumed lost (ms): `probe_timeout_ms`
    after the newest probe's admission, or after the round began when that is later."""
    return max(state.since_ms, state.last_probe_ms) + cfg.probe_timeout_ms


HALF_OPEN_RECHECK_MIN_MS = 1_000


def refused_wait_ms(decision: BreakerDecision, cfg: BreakerConfig) -> int:
    """How long (ms, >= 1) a refused call waits before asking again. Open: until the cool-down
    ends. Half-open: `retry_after_ms` is when the probes' slots time out, but a probe usually
    reports long before that, and a success closes the breaker; so ask again after a tenth of
    the cool-down (at least `HALF_OPEN_RECHECK_MIN_MS`) when that is sooner."""
    wait = decision.retry_after_ms
    if decision.status is BreakerStatus.HALF_OPEN:
        wait = min(wait, max(HALF_OPEN_RECHECK_MIN_MS, cfg.cooldown_ms // 10))
    return max(1, wait)


def _count(state: BreakerState, failed: bool, now_ms: int, cfg: BreakerConfig) -> BreakerState:
    """A closed breaker after one counted outcome: the window rolled, the trip rules applied."""
    if now_ms >= state.window_start_ms + cfg.window_ms:
        state = replace(state, window_start_ms=now_ms, window_calls=0, window_failures=0)
    calls = state.window_calls + 1
    failures = state.window_failures + int(failed)
    consecutive = state.consecutive_failures + 1 if failed else 0
    # In millionths, as integers: 0.28 * 25 is 7.000000000000001, which 7 failures miss.
    rate_ppm = math.floor(cfg.failure_rate * 1_000_000 + 0.5)
    rate_tripped = calls >= cfg.min_calls and failures * 1_000_000 >= rate_ppm * calls
    if consecutive >= cfg.failure_threshold or rate_tripped:
        return fresh(BreakerStatus.OPEN, now_ms)
    return replace(
        state, window_calls=calls, window_failures=failures, consecutive_failures=consecutive
    )


def _probe_result(
    state: BreakerState, outcome: Outcome, now_ms: int, cfg: BreakerConfig
) -> BreakerState:
    """A half-open breaker after one outcome."""
    if outcome is Outcome.IGNORE:
        return replace(state, probes_admitted=max(0, state.probes_admitted - 1))
    if outcome is Outcome.FAILURE:
        return fresh(BreakerStatus.OPEN, now_ms)
    successes = state.probe_successes + 1
    if successes >= cfg.probes:
        return fresh(BreakerStatus.CLOSED, now_ms)
    return replace(state, probe_successes=successes)


def record(
    state: BreakerState,
    outcome: Outcome,
    now_ms: int,
    cfg: BreakerConfig,
    *,
    probe_round: int | None,
) -> BreakerState:
    """The state after one call's `outcome` is reported at `now_ms`; `probe_round`: the
    `BreakerDecision.probe_round` that admitted the call (None: not a probe). While half-open
    only the current round's probes count: a call admitted before the breaker opened, or a
    probe of an ended round, that reports late neither frees a probe's slot nor closes or
    re-opens the breaker, so exactly `cfg.probes` trial calls at a time decide it."""
    if state.status is BreakerStatus.HALF_OPEN:
        current = probe_round is not None and probe_round == state.since_ms
        return _probe_result(state, outcome, now_ms, cfg) if current else state
    if state.status is BreakerStatus.OPEN or outcome is Outcome.IGNORE:
        return state
    return _count(state, outcome is Outcome.FAILURE, now_ms, cfg)
