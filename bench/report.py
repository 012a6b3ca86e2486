"""The benchmark report: every run's results, the summary table (median, min and max of each
figure against its target) and the per-run lines written to docs/benchmarks.md."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import cpu
from bench.common import median
from bench.drain import EXECUTORS, DrainResult
from bench.latency import LatencyResult
from bench.raw import CONSUMERS, RawResult
from bench.recovery import RecoveryResult

PCT, MS, SEC, MS2, MS3, RATE = "{:.1%}", "{:.1f}", "{:.2f}", "{:.2f}", "{:.3f}", "{:,.0f}"


@dataclass(slots=True)
class Results:
    raw: list[RawResult] = field(default_factory=list)
    raw_store: list[RawResult] = field(default_factory=list)
    """(a2): the raw loop sending taskstream's own statements."""
    drain: list[DrainResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    latency2: list[LatencyResult] = field(default_factory=list)
    """(c) with two executor processes instead of one."""
    low: list[LatencyResult] = field(default_factory=list)
    recovery: list[RecoveryResult] = field(default_factory=list)
    foreign: dict[str, list[float]] = field(default_factory=dict)
    """Cores used by other processes just before each measurement, by benchmark letter."""


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    values: list[float]
    unit: str
    target: str = ""
    fmt: str = "{:,.0f}"

    def cells(self) -> list[str]:
        if not self.values:
            return [self.figure, "-", "-", "-", "0", self.target]
        f = self.fmt.format
        vals = self.values
        return [
            self.figure,
            f(median(vals)) + self.unit,
            f(min(vals)) + self.unit,
            f(max(vals)) + self.unit,
            str(len(vals)),
            self.target,
        ]


Spec = tuple[str, Callable[[Any], float], str, str, str]
"""(figure, its value in one run, unit, target, format): one row of the table."""


def _rows(items: Sequence[Any], specs: Sequence[Spec]) -> list[Row]:
    return [
        Row(name, [get(x) for x in items], unit, goal, fmt) for name, get, unit, goal, fmt in specs
    ]


def rows(r: Results, args: argparse.Namespace) -> list[Row]:
    """Every row of the summary table, in the order the figures are explained."""
    pairs = [(a, b) for a, b in zip(r.raw, r.drain, strict=False) if a.rate > 0]
    out = _rows(r.raw, _raw_specs("(a) raw drain")) + _rows(r.drain, _drain_rate_specs(args))
    out += _rows(pairs, _ratio_specs()) + _rows(r.drain, _drain_cost_specs(args))
    if r.raw_store:
        out += _rows(r.raw_store, _raw_specs("(a2) raw drain, taskstream's statements"))
        out += _rows(list(zip(r.raw, r.raw_store, r.drain, strict=False)), _split_specs())
    for label, items, rate, executors in _latency_sets(r, args):
        if items:
            out += _rows(items, _latency_specs(label, rate, executors))
    out += _rows(r.recovery, _recovery_specs())
    for letter, loads in sorted(r.foreign.items()):
        out.append(Row(f"other processes' CPU before ({letter})", loads, " cores", "", MS2))
    return out


def _latency_sets(
    r: Results, args: argparse.Namespace
) -> list[tuple[str, list[LatencyResult], float, int]]:
    """(label, results, rate, executor processes) of each latency benchmark."""
    return [
        ("(c)", r.latency, args.rate, 1),
        ("(c2)", r.latency2, args.rate, 2),
        ("(c')", r.low, args.low_rate, 1),
    ]


def _raw_specs(name: str) -> list[Spec]:
    label = name.split(" ", 1)[0]
    return [
        (f"{name}, {CONSUMERS} consumers", lambda x: x.rate, "/s", "", RATE),
        (f"{label} consumer CPU per entry (both processes)", _per_entry("bench"), " ms", "", MS3),
        (f"{label} MariaDB CPU per entry", _per_entry("mariadb"), " ms", "", MS3),
    ]


def _split_specs() -> list[Spec]:
    """Where (b)/(a) goes: the store's statements (a2)/(a), the framework (b)/(a2)."""
    return [
        ("(a2)/(a): the store's statements", lambda t: t[1].rate / t[0].rate, "", "", PCT),
        ("(b)/(a2): the framework around them", lambda t: t[2].rate / t[1].rate, "", "", PCT),
    ]


def _drain_rate_specs(args: argparse.Namespace) -> list[Spec]:
    drain = f"(b) taskstream drain, {EXECUTORS} executors x {args.concurrency}"
    return [
        (f"{drain}: first claim -> last commit", lambda x: x.rate, "/s", "", RATE),
        ("(b) same, from starting the executor processes", lambda x: x.wall_rate, "/s", "", RATE),
    ]


def _drain_cost_specs(args: argparse.Namespace) -> list[Spec]:
    return [
        (
            "(b) executor CPU per instance (both processes)",
            _per_instance("executor"),
            " ms",
            "",
            MS3,
        ),
        ("(b) MariaDB CPU per instance", _per_instance("mariadb"), " ms", "", MS3),
        ("(b) executor CPU per instance while draining", _steady("executor"), " ms", "", MS3),
        ("(b) MariaDB CPU per instance while draining", _steady("mariadb"), " ms", "", MS3),
        (f"(b) pre-publish ({args.publish}) rate", lambda x: x.publish_rate, "/s", "", RATE),
    ]


def _ratio_specs() -> list[Spec]:
    return [
        ("(b)/(a), per pair", lambda p: p[1].rate / p[0].rate, "", ">= 25%", PCT),
        (
            "(b)/(a), per pair, (b) from process start",
            lambda p: p[1].wall_rate / p[0].rate,
            "",
            "",
            PCT,
        ),
    ]


def _recovery_specs() -> list[Spec]:
    return [
        ("(d) kill -9 -> re-run RUNNING", lambda x: x.recovery_s, " s", "<= 15 s", SEC),
        ("(d) kill -> TIMEOUT (sweeper)", lambda x: x.detect_s, " s", "", SEC),
        ("(d) TIMEOUT -> DISPATCHED (backoff, scheduler)", lambda x: x.reemit_s, " s", "", SEC),
        ("(d) DISPATCHED -> RUNNING (claim)", lambda x: x.claim_s, " s", "", MS3),
    ]


def _per_entry(category: str) -> Callable[[Any], float]:
    return lambda x: x.cpu_ms_per_entry(category)


def _per_instance(category: str) -> Callable[[Any], float]:
    return lambda x: x.cpu_ms_per_instance(category)


def _steady(category: str) -> Callable[[Any], float]:
    """CPU per instance from the first SUCCESS seen to the end: the processes' start-up
    (imports, connecting) left out, so that a change to the run path shows in full."""
    return lambda x: x.steady_ms_per_instance(category)


def _latency_specs(label: str, rate: float, executors: int) -> list[Spec]:
    setting = f"target {rate:g}/s, {executors} executor{'s' if executors > 1 else ''}"
    return [
        (f"{label} achieved rate ({setting})", lambda x: x.achieved_rate, "/s", "", RATE),
        (f"{label} enqueue -> start p50", lambda x: x.p50_ms, " ms", "<= 5 ms", MS),
        (f"{label} enqueue -> start p99", lambda x: x.p99_ms, " ms", "<= 50 ms", MS),
        (f"{label} enqueue -> start max", lambda x: x.max_ms, " ms", "", MS),
        (
            f"{label} of which created -> DISPATCHED p50 (outbox)",
            lambda x: x.to_dispatched_p50_ms,
            " ms",
            "",
            MS,
        ),
        (
            f"{label} of which DISPATCHED -> RUNNING p50 (read, claim)",
            lambda x: x.to_running_p50_ms,
            " ms",
            "",
            MS,
        ),
        (f"{label} Outbox.emit duration p50", lambda x: x.emit_p50_ms, " ms", "", MS),
        (
            f"{label} scheduled but not emitted (publishers behind)",
            lambda x: float(x.skipped),
            "",
            "",
            RATE,
        ),
        (f"{label} CPU per instance: executors", _per_instance("executor"), " ms", "", MS2),
        (
            f"{label} CPU per instance: publisher (Outbox.emit)",
            _per_instance("bench"),
            " ms",
            "",
            MS2,
        ),
        (f"{label} CPU per instance: MariaDB", _per_instance("mariadb"), " ms", "", MS2),
    ]


def table(all_rows: list[Row]) -> str:
    head = ["figure", "median", "min", "max", "runs", "target"]
    body = [row.cells() for row in all_rows]
    widths = [max(len(c[i]) for c in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(parts) + " |"

    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":" if i else ":" + "-" * (w + 1)) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([line(head), sep, *(line(c) for c in body)])


def per_run(r: Results) -> str:
    """Every run's own figures, for the record."""
    out = [
        f"- {label} run {i + 1}: {x.entries} entries in {x.seconds:.3f} s = {x.rate:,.0f}/s,"
        f" {x.batches} batches, {x.success_rows} rows SUCCESS; CPU s: {_cpu(x.cpu)}"
        for label, items in (("(a)", r.raw), ("(a2)", r.raw_store))
        for i, x in enumerate(items)
    ]
    for i, b in enumerate(r.drain):
        out.append(
            f"- (b) run {i + 1}: {b.success}/{b.instances} SUCCESS; drain {b.drain_s:.2f} s ="
            f" {b.rate:,.0f}/s; from process start {b.wall_s:.2f} s; mean claim batch"
            f" {b.instances / max(b.claim_batches, 1):.0f}, commit batch"
            f" {b.instances / max(b.commit_batches, 1):.0f}; CPU s: {_cpu(b.cpu)};"
            f" server commands per instance: {_calls(b.calls)}"
        )
    for label, items in (("(c)", r.latency), ("(c2)", r.latency2), ("(c')", r.low)):
        for i, c in enumerate(items):
            out.append(
                f"- {label} run {i + 1}: {c.executors} executor(s), {c.instances} instances at"
                f" {c.achieved_rate:,.0f}/s"
                f" (target {c.target_rate:g}), {c.skipped} not emitted; p50 {c.p50_ms:.0f} ms,"
                f" p99 {c.p99_ms:.0f} ms, max {c.max_ms:.0f} ms; publish lag p99"
                f" {c.publish_lag_p99_ms:.0f} ms; claims that raced the outbox CAS: {c.raced};"
                f" CPU s: {_cpu(c.cpu)}; server commands per instance: {_calls(c.calls)}"
            )
    out += [
        f"- (d) run {i + 1}: {d.recovery_s:.2f} s (detect {d.detect_s:.2f}, re-emit"
        f" {d.reemit_s:.2f}, claim {d.claim_s:.3f})"
        for i, d in enumerate(r.recovery)
    ]
    return "\n".join(out)


def _cpu(used: dict[str, float]) -> str:
    return ", ".join(f"{k} {used.get(k, 0):.2f}" for k in cpu.CATEGORIES)


def _calls(calls: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in calls.items())
