"""`scripts/bench` replaces the recorded results only with a full run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import parse
from bench.common import ROOT

RECORDED = ROOT / "docs" / "benchmarks.md"


def test_a_full_run_writes_the_recorded_results() -> None:
    assert parse([]).doc == RECORDED


@pytest.mark.parametrize(
    "argv",
    [
        ["--only", "b"],
        ["--quick"],
        ["--runs", "1"],
        ["--size", "40000"],
        ["--rate", "300"],
        ["--publish", "outbox"],
        ["--no-doc"],
    ],
)
def test_a_partial_or_resized_run_writes_nothing_by_default(argv: list[str]) -> None:
    assert parse(argv).doc is None


def test_a_results_file_named_is_written_whatever_the_run(tmp_path: Path) -> None:
    assert parse(["--only", "b", "--doc", str(tmp_path / "r.md")]).doc == tmp_path / "r.md"
