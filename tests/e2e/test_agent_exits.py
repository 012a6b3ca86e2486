"""An agent that calls `sys.exit()` in a task of its own, in a real executor process: its
attempt fails and the executor keeps serving (it exited 3 before, its runs left RUNNING)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e.cli_rig import applied, role_process, run_cli, wait_for

ROOT = Path(__file__).resolve().parents[2]
ODD = (
    "tasks:\n  - {id: odd, agent: flaky, retry: {max_attempts: 2, backoff: {base: 60s},"
    " jitter: 0}, payload: {fail_until: 1, kind: exit_in_task}}\n"
)


def test_sys_exit_in_an_agents_task_fails_the_run_not_the_executor(
    tmp_path: Path, redis_url: str
) -> None:
    with applied(tmp_path, redis_url, {}) as cli:
        path = os.environ.get("PYTHONPATH")
        env = cli.env | {
            "TASKSTREAM_AGENT_MODULES": "tests.agents",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        }
        (tmp_path / "odd.yaml").write_text(ODD)
        run_cli("tasks", "apply", "odd.yaml", env=env, cwd=tmp_path, check=True)
        triggered = run_cli("trigger", "odd", env=env, cwd=tmp_path, check=True)
        instance_id = triggered.stdout.split()[2]

        def instance() -> dict[str, object]:
            out = run_cli("inspect", instance_id, "--json", env=env, cwd=tmp_path, check=True)
            found: dict[str, object] = json.loads(out.stdout)["instance"]
            return found

        with role_process("executor", env, tmp_path / "executor.log") as proc:
            retried = wait_for(lambda: instance()["status"] == "RETRYING", 60)
            alive = proc.poll() is None
        log = (tmp_path / "executor.log").read_text()
        assert retried and alive, log
        assert proc.returncode == 0, log
        assert instance()["last_error"] == "ExitInTask: SystemExit: 3"
