"""A role whose Redis user may not run a command it needs ends at start, naming the command,
with exit 2 (a configuration error), rather than running until it first needs it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from taskstream.core.protocol import Keys
from tests.e2e.cli_rig import migrated_store, run_cli
from tests.support.acl import PASSWORD, as_user


@pytest.mark.parametrize("role", ["executor", "sweeper", "scheduler"])
def test_a_role_denied_a_command_exits_2_naming_it(
    tmp_path: Path, redis_url: str, role: str
) -> None:
    keys = Keys(namespace="e2e" + uuid.uuid4().hex[:12])
    user = "tsacl-" + uuid.uuid4().hex[:12]
    admin = redis.Redis.from_url(redis_url)
    rules = [f"~{keys.base}:*", f"&{keys.control}", "+@all", "-xadd"]
    acl: Any = admin.execute_command
    acl("ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}", *rules)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
        env |= {
            "TASKSTREAM_DATABASE_URL": migrated_store(tmp_path),
            "TASKSTREAM_REDIS_URL": as_user(redis_url, user),
            "TASKSTREAM_NAMESPACE": keys.namespace,
        }
        out = run_cli(role, env=env)
    finally:
        acl("ACL", "DELUSER", user)
        admin.close()
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    said = "NOPERM this user has no permissions to run the 'xadd' command"
    assert f"redis refuses the {role} XADD: {said}" in lines
    assert any("docs/operations.md" in line for line in lines)
    assert "Traceback" not in out.stderr and PASSWORD not in out.stderr
