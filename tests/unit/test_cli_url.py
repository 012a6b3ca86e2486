"""`taskstream url WHICH`: a WHICH other than `redis` or `database` is a usage error (exit 2)
whether or not a cluster can be found, as every invalid argument is."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from taskstream.cli.main import app


def test_an_unknown_url_name_is_a_usage_error_before_any_cluster_is_looked_for(
    tmp_path: Path,
) -> None:
    env = {
        "TASKSTREAM_HOME": str(tmp_path / "none"),  # no cluster there
        "TASKSTREAM_REDIS_URL": None,
        "TASKSTREAM_DATABASE_URL": None,
        "COLUMNS": "200",
    }
    result = CliRunner().invoke(app, ["url", "redsi"], env=env, color=False)
    assert result.exit_code == 2, result.output
    assert "expected 'redis' or 'database'" in result.output
