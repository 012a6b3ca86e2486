"""Must show (issue #5), clock skew, callers: processes whose wall clocks run 5 minutes fast,
5 minutes slow and true share one upstream limit, and the upstream still never sees more than
the limit in any window. The limiter decides on the Redis server's clock, so a caller's own
clock cannot move its admissions.

The skew is libfaketime's (`LD_PRELOAD`, wall clock only); each process reports its
`time.time()` next to its monotonic clock, and the test fails unless the skew really applied.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.conftest import Cluster, RecordProperty
from tests.soak.hammer_rig import Member, Report, hammer_upstream
from tests.support.arrivals import count_from, max_in_window, min_span
from tests.support.faketime import skew_env

pytestmark = pytest.mark.fault

LIMIT = 20
WINDOW_S = 10.0
RUN_S = 30.0
CALLERS = 4
SKEWS_S = (300, -300, 0, 300, -300, 0)
"""Two processes per clock: 5 minutes fast, 5 minutes slow, true."""
SKEW_TOLERANCE_S = 2.0
"""How far a process's measured offset may be from the skew it was given (seconds)."""
MAX_CALLS = int(RUN_S // WINDOW_S) * LIMIT
"""60: three back-to-back 10 s windows tile any 30 s span, each holding at most LIMIT."""
LEAST_CALLS = MAX_CALLS * 9 // 10
"""54: 90 % of `MAX_CALLS`, as in the hammer run."""


def _crowd(lib: Path) -> list[Member]:
    """Every process runs under libfaketime, the true-clock ones with an offset of 0: the
    library slows each clock read a little, and so no group is handicapped by it."""
    return [
        Member(f"skew{skew:+d}-{i}", skew_env(lib, skew), skew)
        for i, skew in enumerate(SKEWS_S, start=1)
    ]


def _assert_skews_applied(reports: list[Report]) -> None:
    for report in reports:
        offset, skew = report.wall_offset_s, report.member.skew_s
        assert abs(offset - skew) < SKEW_TOLERANCE_S, (
            f"{report.member.name}: time.time() is {offset:+.3f} s off, expected {skew:+d} s; "
            "libfaketime did not apply"
        )


@pytest.mark.timeout(240)
async def test_skewed_callers_share_one_limit(
    cluster: Cluster, libfaketime: Path, record_property: RecordProperty
) -> None:
    crowd = _crowd(libfaketime)
    reports, arrivals = await hammer_upstream(
        cluster, crowd, limit=LIMIT, window_s=WINDOW_S, callers=CALLERS, seconds=RUN_S
    )

    in_run = count_from(arrivals, arrivals[0], RUN_S) if arrivals else 0
    fullest = max_in_window(arrivals, WINDOW_S)
    tightest = min_span(arrivals, LIMIT)
    summary = {
        "offsets_s": {r.member.name: round(r.wall_offset_s, 3) for r in reports},
        "calls": {r.member.name: r.calls for r in reports},
        "calls_in_run": in_run,
        "max_in_window": fullest,
        "min_span_k_k20_s": None if tightest is None else round(tightest, 4),
    }
    for name, value in summary.items():
        record_property(name, value)
    print("skewed callers:", summary)

    _assert_skews_applied(reports)
    assert [r.errors for r in reports] == [[]] * len(crowd)
    assert sum(r.calls for r in reports) == len(arrivals)
    by_clock = {skew: sum(r.calls for r in reports if r.member.skew_s == skew) for skew in SKEWS_S}
    assert all(by_clock.values()), f"every clock got calls through: {by_clock}"
    assert fullest <= LIMIT, summary
    assert tightest is not None
    assert tightest >= WINDOW_S, summary
    assert LEAST_CALLS <= in_run <= MAX_CALLS, summary
