"""Ctrl-C and the role processes: under `up` a role leaves its stop to `up`'s SIGTERM, from its
first instant on; run alone it stops on Ctrl-C as on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from taskstream.runtime.endpoint import Endpoints
from taskstream.runtime.supervisor import Child, Supervisor, role_argv
from tests.e2e.cli_rig import applied, role_process, wait_for
from tests.integration.harness import until

pytestmark = pytest.mark.roles


async def test_a_role_under_up_ignores_an_interrupt_sent_as_it_starts(
    tmp_path: Path,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The terminal's Ctrl-C reaches every process of `up`'s group, a role still importing
    too: it must neither end nor print a traceback. `up`'s SIGTERM then stops it, exit 0."""
    with applied(tmp_path, redis_url, {}) as cli:
        monkeypatch.setenv("TASKSTREAM_NAMESPACE", cli.env["TASKSTREAM_NAMESPACE"])
        endpoints = Endpoints(redis_url, cli.env["TASKSTREAM_DATABASE_URL"])
        child = Child("sweeper", role_argv("sweeper"))
        stop = asyncio.Event()
        running = asyncio.create_task(Supervisor(endpoints, [child], grace_s=1).run(stop))

        async def spawned() -> bool:
            return child.proc is not None

        await until(spawned)
        first = child.proc
        assert first is not None
        os.kill(first.pid, signal.SIGINT)
        err = ""

        async def started() -> bool:
            nonlocal err
            err += capfd.readouterr().err
            return "sweeper.started" in err or first.returncode is not None

        await until(started)
        assert first.returncode is None, err
        stop.set()
        await asyncio.wait_for(running, timeout=10)
    err += capfd.readouterr().err
    assert first.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_role_run_alone_stops_on_an_interrupt(tmp_path: Path, redis_url: str) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        log = tmp_path / "sweeper.log"
        with role_process("sweeper", cli.env, log) as proc:
            assert wait_for(lambda: "sweeper.started" in log.read_text(), 30), log.read_text()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
    assert "Traceback" not in log.read_text()
