"""An agent's params read from its instance's payload, on real Redis and a real store (clock
passed in): the payload is JSON, so a strict params model takes a date, an enum or a tuple
from its JSON form, as pydantic reads JSON; a payload that does not validate still fails the
run at once (`bad_params`)."""

from __future__ import annotations

from taskstream.core import streams
from taskstream.core.clock import FixedClock
from taskstream.core.protocol import Keys
from taskstream.core.states import FailClass
from taskstream.core.store.sql import SqlStore
from taskstream.executor.outcome import RunEnd
from taskstream.executor.runner import RunEnv, execute
from tests.integration.harness import Harness
from tests.integration.outages import intake
from tests.integration.scheduler_cases import M0


async def _run(h: Harness, payload: str) -> RunEnd:
    """Run the `dated` agent once with `payload` (YAML flow mapping) and say how it ended."""
    tasks = f"tasks:\n  - {{id: dated, agent: dated, payload: {payload}}}\n"
    await h.apply(tasks)
    await h.trigger(tasks, "dated", M0)
    [delivery] = await streams.read(h.redis, h.keys, "c1", count=1, block_ms=10)
    [run] = await (await intake(h, "c1")).admit([delivery])
    return await execute(run, RunEnv(h.store, h.clock, max_payload_bytes=1 << 20))


async def test_a_strict_params_model_reads_its_payload_as_json(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """It used to be read as Python objects, where a strict model takes no string for a date
    or an enum and no list for a tuple: every run failed `bad_params`, whatever the payload."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    end = await _run(h, '{when: "2026-05-28", mode: thorough, tags: [a, b]}')
    assert end.failure is None, end.error
    assert end.result == {"weekday": 4, "mode": "thorough", "tags": ["a", "b"]}


async def test_a_payload_a_strict_model_refuses_still_fails_at_once(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    end = await _run(h, '{when: "2026-05-28", mode: slow}')
    assert end.reason == "bad_params" and end.fail_class is FailClass.FATAL
    assert "mode" in (end.error or "")


async def test_a_refused_payload_is_not_quoted_in_the_run_error(
    store: SqlStore, redis: streams.Redis, keys: Keys
) -> None:
    """The error names the fields and what is wrong with them, never their values: a payload
    may carry a credential, and `last_error` is shown by `inspect` and `dead list`. It used to
    quote the refused input, the whole payload for a missing field."""
    h = Harness(store, redis, keys, FixedClock(M0 + 1))
    end = await _run(h, "{mode: SEKRET-mode, token: SEKRET-token}")
    assert end.reason == "bad_params" and end.fail_class is FailClass.FATAL
    error = end.error or ""
    assert "SEKRET" not in error
    assert error.splitlines()[0] == "3 validation errors for StrictParams"
    assert "when: Field required" in error and "token: Extra inputs are not permitted" in error
