"""Must show (issue #5): eight processes of four callers each hammer one upstream limited to
50 calls per 10 s for 60 s; the upstream's own arrival log never holds more than 50 calls in
any 10 s and the limit is used to at least 90 %.

Callers go the product's way (`UpstreamClient` over the executor's `UpstreamGate`, `RedisLimiter`
and `RedisBreakers`, limits read from the store); a refused call waits its `retry_after_ms`.
The upstream is its own process and stamps each request as it arrives, so the check counts
arrivals, not admissions: the delay between the two differs from call to call.
"""

from __future__ import annotations

import pytest

from tests.fault.conftest import Cluster, RecordProperty
from tests.soak.hammer_rig import Member, hammer_upstream
from tests.support.arrivals import count_from, max_in_window, min_span

pytestmark = pytest.mark.fault

LIMIT = 50
WINDOW_S = 10.0
RUN_S = 60.0
PROCESSES = 8
CALLERS = 4
MAX_CALLS = int(RUN_S // WINDOW_S) * LIMIT
"""300: the six back-to-back windows [t, t + 10 s), ..., [t + 50 s, t + 60 s) tile any 60 s
span, and each holds at most LIMIT arrivals."""
LEAST_CALLS = MAX_CALLS * 9 // 10
"""270: 90 % of `MAX_CALLS`."""


@pytest.mark.timeout(300)
async def test_hammer_stays_under_the_limit_and_uses_it(
    cluster: Cluster, record_property: RecordProperty
) -> None:
    """Counted over the upstream's arrival log (monotonic seconds, sorted):

    - no half-open 10 s span holds more than 50 arrivals, i.e. arrival k + 50 always comes at
      least 10 s after arrival k (`min_span(log, 50) >= 10 s`);
    - the 60 s from the first arrival hold at least `LEAST_CALLS` = 270 of them. The bound:
      the half-open spans [t, t + 10 s), ..., [t + 50 s, t + 60 s) tile the 60 s, and each may
      hold at most 50 arrivals, so no limiter can pass more than `MAX_CALLS` = 6 x 50 = 300;
      270 is 90 % of that. The executors' guard band (2 %, so a hit counts for 10.2 s) does
      not lower the ceiling reachable here: a fresh 50 can start at 0, 10.2, ..., 51 s, and
      5 x 10.2 s = 51 s < 60 s leaves room for all six.
    """
    crowd = [Member(f"hammer-{i}", {}) for i in range(1, PROCESSES + 1)]
    reports, arrivals = await hammer_upstream(
        cluster, crowd, limit=LIMIT, window_s=WINDOW_S, callers=CALLERS, seconds=RUN_S
    )

    made = sum(r.calls for r in reports)
    in_run = count_from(arrivals, arrivals[0], RUN_S) if arrivals else 0
    fullest = max_in_window(arrivals, WINDOW_S)
    tightest = min_span(arrivals, LIMIT)
    summary = {
        "arrivals": len(arrivals),
        "calls_in_60s": in_run,
        "max_in_10s": fullest,
        "min_span_k_k50_s": None if tightest is None else round(tightest, 4),
        "deferred": sum(r.deferred for r in reports),
        "calls_by_process": [r.calls for r in reports],
    }
    for name, value in summary.items():
        record_property(name, value)
    print("hammer:", summary)

    assert [r.errors for r in reports] == [[]] * PROCESSES
    assert made == len(arrivals), "every admitted call arrived, and nothing else did"
    assert all(r.calls > 0 for r in reports), "no process was starved"
    assert fullest <= LIMIT, summary
    assert tightest is not None
    assert tightest >= WINDOW_S, summary
    assert LEAST_CALLS <= in_run <= MAX_CALLS, summary
