"""The vocabulary of scheduling decisions (pure): the decision names of the explain log
(DESIGN.md §7), the `Decision` record, and the facts a tick is decided from (`TickFacts`).
`decide.decide_tick` applies the rules; catch-up, holds, recall and the explain log speak in
these terms.

All instants are UTC epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

SHOULD_RUN: Final = "should_run"
SKIP_WINDOW: Final = "skip_window"
SKIP_CALENDAR: Final = "skip_calendar"
SKIP_OVERLAP: Final = "skip_overlap"
SKIP_DEP: Final = "skip_dep"
SKIP_DUPLICATED: Final = "skip_duplicated"
MISSED: Final = "missed"
COALESCED: Final = "coalesced"
DEFERRED: Final = "deferred"
WAIT_DEP: Final = "wait_dep"
NOT_FINAL: Final = frozenset({DEFERRED, WAIT_DEP})
"""Decisions after which the tick is decided again later; every other one is final."""
MANUAL: Final = "manual"
"""Detail key (True) of the decision an operator's `trigger` records at its fire time."""
BACKFILL: Final = "backfill"
"""Detail key (True) of the decisions `backfill` records, one per fire time."""

CheckResult = Literal["pass", "fail", "unavailable"]
_CHECK_RESULTS: Final = frozenset({"pass", "fail", "unavailable"})


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one fire time, why (`reason` names the rule), and the values it saw.

    `until_ms` is set on the non-final decisions: for `deferred` the instant to decide again
    (the held start); for `wait_dep` the instant the window closes. Decide a waiting tick again
    (with `TickFacts.previous="wait_dep"`) on each pass or when a marker appears; once the
    window has closed it becomes `skip_dep` if still not ready.
    """

    decision: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    until_ms: int | None = None

    @property
    def runs(self) -> bool:
        """True for `should_run`: the caller creates the instance."""
        return self.decision == SHOULD_RUN

    @property
    def final(self) -> bool:
        """False for `wait_dep` and `deferred`, which are decided again later."""
        return self.decision not in NOT_FINAL


@dataclass(frozen=True, slots=True)
class ActiveInstance:
    """Another instance of the same task that is still active (not settled); its fire time
    (`scheduled_for_ms`, epoch ms) when known. It may be newer than the tick being decided:
    a manual trigger, or a later tick that ran while this one waited."""

    id: str
    status: str
    scheduled_for_ms: int | None = None


@dataclass(frozen=True, slots=True)
class TickFacts:
    """What the caller gathered about one tick before deciding it.

    `missing_markers`: `depends_on` markers not set for this tick's business date.
    `preconditions`: results by check name; a declared check with no result is `unavailable`.
    `catchup`: the tick was admitted by the catch-up policy after its window closed.
    `earlier_active`: under `concurrency: replace`, the ids of the task's active instances that
    fire before this tick, oldest first (as many as were read): the ones the run replaces.
    It holds `active_instance` whenever that fires earlier.
    `previous`: the tick's last decision when it was non-final (`wait_dep`, `deferred`), else
    None (first decision); `previous_until_ms` the instant that decision held it until.
    `after_maintenance`: a catch-up tick that is late only because it waited for a maintenance
    window (see `held_for_maintenance`). It is not a missed fire time, and its readiness was
    never checked (the calendar comes first), so it is checked now whatever `only_if_ready`
    says.
    """

    fire_ms: int
    active_instance: ActiveInstance | None = None
    missing_markers: tuple[str, ...] = ()
    preconditions: Mapping[str, CheckResult] = field(default_factory=lambda: MappingProxyType({}))
    catchup: bool = False
    previous: str | None = None
    previous_until_ms: int | None = None
    after_maintenance: bool = False
    earlier_active: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.previous is not None and self.previous not in NOT_FINAL:
            raise ValueError(f"previous must be None, wait_dep or deferred, got {self.previous!r}")
        bad = {k: v for k, v in self.preconditions.items() if v not in _CHECK_RESULTS}
        if bad:
            raise ValueError(f"precondition results must be pass|fail|unavailable, got {bad}")


def waits_for_maintenance(decision: Decision | None) -> bool:
    """True for a tick deferred to the end of a maintenance window (not a `not_before` hold)."""
    if decision is None or decision.decision != DEFERRED:
        return False
    calendar = decision.details.get("calendar")
    return isinstance(calendar, Mapping) and calendar.get("rule") == "maintenance"


AFTER_MAINTENANCE: Final = "after_maintenance"
"""Details key set on the decisions of a tick decided as `TickFacts.after_maintenance`."""


def decided_late(decision: Decision | None) -> bool:
    """Whether `decision` was made for a tick that catch-up had admitted (its window had
    closed): deciding that tick again keeps its catch-up window."""
    return decision is not None and decision.details.get("catchup") is True


def held_for_maintenance(previous: Decision | None) -> bool:
    """Whether a tick whose `previous` (non-final) decision this is became late by waiting for
    a maintenance window: that decision is a wait that began while the tick was on time, or a
    later hold of such a tick (a `not_before` after the window, say). A missed tick that
    catch-up admitted and a window then held is still a missed one."""
    if previous is None:
        return False
    if previous.details.get(AFTER_MAINTENANCE) is True:
        return True
    return waits_for_maintenance(previous) and not decided_late(previous)


def by_operator(details: Mapping[str, Any]) -> bool:
    """Whether a decision row records an operator's `trigger` or `backfill` rather than the
    scheduler's decision of its tick: such a row never decides the tick (its instance may
    have another dedupe key, and the tick is still the scheduler's to decide)."""
    return details.get(MANUAL) is True or details.get(BACKFILL) is True
