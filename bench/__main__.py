"""`python -m bench`: run every benchmark, print the results table, write docs/benchmarks.md.

    scripts/bench            3 runs of each figure (about 5 minutes), writes docs/benchmarks.md
    scripts/bench --quick    1 small run of each, prints only (a smoke check)

(a) and (b) run alternately, a then b, so that drift of the shared machine hits both alike;
the ratio (b)/(a) is computed per pair. Before each measurement the run waits (at most 30 s)
for the machine to be quiet: this host is shared, and the CPU other processes use during each
run is reported next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import cpu
from bench.common import ROOT, Services, median, mysql_value, say
from bench.drain import EXECUTORS, DrainResult, run_drain
from bench.latency import LatencyResult, run_latency
from bench.profile import summarize
from bench.raw import CONSUMERS, RawResult, run_raw
from bench.recovery import RecoveryResult, run_recovery

BEGIN = "<!-- bench:results:begin -->"
END = "<!-- bench:results:end -->"
QUIET_CORES = 0.3
QUIET_WAIT_S = 30.0


@dataclass(slots=True)
class Results:
    raw: list[RawResult] = field(default_factory=list)
    drain: list[DrainResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    low: list[LatencyResult] = field(default_factory=list)
    recovery: list[RecoveryResult] = field(default_factory=list)
    foreign: dict[str, list[float]] = field(default_factory=dict)
    """Cores used by other processes just before each measurement, by benchmark letter."""


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 run each, small sizes, no doc")
    p.add_argument("--runs", type=int, default=None, help="runs of each figure (3)")
    p.add_argument("--raw-size", type=int, default=None, help="(a) entries (50000)")
    p.add_argument("--size", type=int, default=None, help="(b) instances (20000)")
    p.add_argument("--concurrency", type=int, default=200, help="--concurrency per executor")
    p.add_argument("--publish", choices=("bulk", "outbox"), default="bulk", help="(b) pre-publish")
    p.add_argument("--rate", type=float, default=500.0, help="(c) instances/s")
    p.add_argument("--low-rate", type=float, default=50.0, help="(c) second rate; 0 skips it")
    p.add_argument("--seconds", type=float, default=None, help="(c) window (20)")
    p.add_argument("--only", default="abcd", help="which of a, b, c, d to run")
    p.add_argument("--doc", type=Path, default=None, help="results file (full runs only)")
    p.add_argument("--no-doc", action="store_true", help="do not write the results file")
    p.add_argument("--profile", type=Path, default=None, help="py-spy one more (b) to FILE")
    p.add_argument("--keep-logs", action="store_true", help="keep the roles' logs")
    args = p.parse_args(argv)
    quick = bool(args.quick)
    args.runs = args.runs or (1 if quick else 3)
    args.raw_size = args.raw_size or (5_000 if quick else 50_000)
    args.size = args.size or (2_000 if quick else 20_000)
    args.seconds = args.seconds or (5.0 if quick else 20.0)
    if args.doc is None and not quick and not args.no_doc:
        args.doc = ROOT / "docs" / "benchmarks.md"
    if args.no_doc:
        args.doc = None
    return args


async def quiet(letter: str, results: Results) -> None:
    """Wait (bounded) until other processes use less than `QUIET_CORES`; record the load."""
    deadline = time.monotonic() + QUIET_WAIT_S
    load = await asyncio.to_thread(cpu.foreign_load, 1.0)
    while load > QUIET_CORES and time.monotonic() < deadline:
        say(f"machine busy: other processes use {load:.2f} cores; waiting")
        load = await asyncio.to_thread(cpu.foreign_load, 2.0)
    results.foreign.setdefault(letter, []).append(load)


def publishers_for(rate: float) -> int:
    """Publisher processes: one per 1,000/s. The scheduler emits from one process, and one
    `Outbox` keeps up with 500/s here since it group-commits (about 1.2 ms of CPU per emit)."""
    return max(1, math.ceil(rate / 1000))


async def run_all(args: argparse.Namespace, svc: Services, logdir: Path) -> Results:
    r = Results()
    only = str(args.only)
    for i in range(args.runs):
        if "a" in only:
            say(f"(a) run {i + 1}/{args.runs}")
            await quiet("a", r)
            r.raw.append(await run_raw(svc, args.raw_size))
        if "b" in only:
            say(f"(b) run {i + 1}/{args.runs}")
            await quiet("b", r)
            r.drain.append(
                await run_drain(
                    svc,
                    args.size,
                    concurrency=args.concurrency,
                    mode=args.publish,
                    logdir=_fresh(logdir / f"b{i}"),
                )
            )
    rates = [("c", args.rate, r.latency)]
    if args.low_rate > 0:
        rates.append(("c-low", args.low_rate, r.low))
    for letter, rate, out in rates:
        if "c" not in only:
            break
        for i in range(args.runs):
            say(f"(c) {rate:g}/s run {i + 1}/{args.runs}")
            await quiet(letter, r)
            out.append(
                await run_latency(
                    svc,
                    rate=rate,
                    seconds=args.seconds,
                    concurrency=args.concurrency,
                    publishers=publishers_for(rate),
                    logdir=_fresh(logdir / f"{letter}{i}"),
                )
            )
    for i in range(args.runs if "d" in only else 0):
        say(f"(d) run {i + 1}/{args.runs}")
        await quiet("d", r)
        r.recovery.append(await run_recovery(svc, logdir=_fresh(logdir / f"d{i}")))
    if args.profile is not None:
        say("profiling one more (b) run")
        await run_drain(
            svc,
            args.size,
            concurrency=args.concurrency,
            mode=args.publish,
            logdir=_fresh(logdir / "profile"),
            profile=args.profile,
        )
    return r


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# the table


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


def rows(r: Results, args: argparse.Namespace) -> list[Row]:
    pct = "{:.1%}"
    ms = "{:.1f}"
    sec = "{:.2f}"
    ratios = [b.rate / a.rate for a, b in zip(r.raw, r.drain, strict=False) if a.rate > 0]
    wall_ratios = [b.wall_rate / a.rate for a, b in zip(r.raw, r.drain, strict=False) if a.rate > 0]

    def each(items: Sequence[Any], get: Callable[[Any], float]) -> list[float]:
        return [get(x) for x in items]

    out = [
        Row(f"(a) raw drain, {CONSUMERS} consumers", each(r.raw, lambda x: x.rate), "/s"),
        Row(
            "(a) consumer CPU per entry (both processes)",
            each(r.raw, lambda x: x.cpu_ms_per_entry("bench")),
            " ms",
            "",
            "{:.3f}",
        ),
        Row(
            "(a) MariaDB CPU per entry",
            each(r.raw, lambda x: x.cpu_ms_per_entry("mariadb")),
            " ms",
            "",
            "{:.3f}",
        ),
        Row(
            f"(b) taskstream drain, {EXECUTORS} executors x {args.concurrency}: first claim"
            " -> last commit",
            each(r.drain, lambda x: x.rate),
            "/s",
        ),
        Row(
            "(b) same, from starting the executor processes",
            each(r.drain, lambda x: x.wall_rate),
            "/s",
        ),
        Row("(b)/(a), per pair", ratios, "", ">= 25%", pct),
        Row("(b)/(a), per pair, (b) from process start", wall_ratios, "", "", pct),
        Row(
            "(b) executor CPU per instance (both processes)",
            each(r.drain, lambda x: x.cpu_ms_per_instance("executor")),
            " ms",
            "",
            "{:.3f}",
        ),
        Row(
            "(b) MariaDB CPU per instance",
            each(r.drain, lambda x: x.cpu_ms_per_instance("mariadb")),
            " ms",
            "",
            "{:.3f}",
        ),
        Row(
            f"(b) pre-publish ({args.publish}) rate",
            each(r.drain, lambda x: x.publish_rate),
            "/s",
        ),
    ]
    for label, items, rate in (("(c)", r.latency, args.rate), ("(c')", r.low, args.low_rate)):
        if not items:
            continue
        out += [
            Row(
                f"{label} achieved rate (target {rate:g}/s)",
                each(items, lambda x: x.achieved_rate),
                "/s",
            ),
            Row(
                f"{label} enqueue -> start p50",
                each(items, lambda x: x.p50_ms),
                " ms",
                "<= 5 ms",
                ms,
            ),
            Row(
                f"{label} enqueue -> start p99",
                each(items, lambda x: x.p99_ms),
                " ms",
                "<= 50 ms",
                ms,
            ),
            Row(f"{label} enqueue -> start max", each(items, lambda x: x.max_ms), " ms", "", ms),
            Row(
                f"{label} of which created -> DISPATCHED p50 (outbox)",
                each(items, lambda x: x.to_dispatched_p50_ms),
                " ms",
                "",
                ms,
            ),
            Row(
                f"{label} of which DISPATCHED -> RUNNING p50 (read, claim)",
                each(items, lambda x: x.to_running_p50_ms),
                " ms",
                "",
                ms,
            ),
            Row(
                f"{label} Outbox.emit duration p50",
                each(items, lambda x: x.emit_p50_ms),
                " ms",
                "",
                ms,
            ),
            Row(
                f"{label} scheduled but not emitted (publishers behind)",
                each(items, lambda x: float(x.skipped)),
                "",
            ),
            Row(
                f"{label} CPU per instance: executors",
                each(items, lambda x: x.cpu["executor"] * 1000 / max(x.instances, 1)),
                " ms",
                "",
                "{:.2f}",
            ),
            Row(
                f"{label} CPU per instance: publisher (Outbox.emit)",
                each(items, lambda x: x.cpu["bench"] * 1000 / max(x.instances, 1)),
                " ms",
                "",
                "{:.2f}",
            ),
            Row(
                f"{label} CPU per instance: MariaDB",
                each(items, lambda x: x.cpu["mariadb"] * 1000 / max(x.instances, 1)),
                " ms",
                "",
                "{:.2f}",
            ),
        ]
    out += [
        Row(
            "(d) kill -9 -> re-run RUNNING",
            each(r.recovery, lambda x: x.recovery_s),
            " s",
            "<= 15 s",
            sec,
        ),
        Row("(d) kill -> TIMEOUT (sweeper)", each(r.recovery, lambda x: x.detect_s), " s", "", sec),
        Row(
            "(d) TIMEOUT -> DISPATCHED (backoff, scheduler)",
            each(r.recovery, lambda x: x.reemit_s),
            " s",
            "",
            sec,
        ),
        Row(
            "(d) DISPATCHED -> RUNNING (claim)",
            each(r.recovery, lambda x: x.claim_s),
            " s",
            "",
            "{:.3f}",
        ),
    ]
    for letter, loads in sorted(r.foreign.items()):
        out.append(Row(f"other processes' CPU before ({letter})", loads, " cores", "", "{:.2f}"))
    return out


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
        f"- (a) run {i + 1}: {x.entries} entries in {x.seconds:.3f} s = {x.rate:,.0f}/s,"
        f" {x.batches} batches, {x.success_rows} rows SUCCESS; CPU s: {_cpu(x.cpu)}"
        for i, x in enumerate(r.raw)
    ]
    for i, b in enumerate(r.drain):
        out.append(
            f"- (b) run {i + 1}: {b.success}/{b.instances} SUCCESS; drain {b.drain_s:.2f} s ="
            f" {b.rate:,.0f}/s; from process start {b.wall_s:.2f} s; mean claim batch"
            f" {b.instances / max(b.claim_batches, 1):.0f}, commit batch"
            f" {b.instances / max(b.commit_batches, 1):.0f}; CPU s: {_cpu(b.cpu)};"
            f" server commands per instance: {_calls(b.calls)}"
        )
    for label, items in (("(c)", r.latency), ("(c')", r.low)):
        for i, c in enumerate(items):
            out.append(
                f"- {label} run {i + 1}: {c.instances} instances at {c.achieved_rate:,.0f}/s"
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


def _first(path: str, prefix: str) -> str:
    lines = Path(path).read_text().splitlines()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(prefix)), "?")


async def machine(svc: Services, head: str) -> list[str]:
    import redis.asyncio as aioredis  # noqa: PLC0415 - only for the description

    model = _first("/proc/cpuinfo", "model name")
    mem_kb = _first("/proc/meminfo", "MemTotal").split()[0]
    mem = f"{int(mem_kb) / 2**20:.0f} GiB" if mem_kb.isdigit() else "?"
    client = aioredis.Redis.from_url(svc.redis_url)
    try:
        redis_version = (await client.info("server"))["redis_version"]
    finally:
        await client.aclose()
    maria = await mysql_value(svc, "SELECT VERSION()")
    flush = await mysql_value(svc, "SELECT @@innodb_flush_log_at_trx_commit")
    binlog = await mysql_value(svc, "SELECT @@log_bin")
    libs = ", ".join(f"{name} {version(name)}" for name in ("SQLAlchemy", "asyncmy", "redis"))
    return [
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; taskstream commit {head}",
        f"- machine: nproc {os.cpu_count()}, {model}, {mem} RAM, Linux {platform.release()}",
        f"- Python {platform.python_version()}; {libs}",
        f"- Redis {redis_version} (127.0.0.1:6379); MariaDB {maria} (127.0.0.1:3306, InnoDB,"
        f" innodb_flush_log_at_trx_commit={flush}, log_bin={binlog})",
    ]


def _git_head() -> str:
    git = shutil.which("git")
    if git is None:
        return "unknown"
    done = subprocess.run(  # noqa: S603 - a read-only query of our own checkout
        [git, "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def document(args: argparse.Namespace, facts: list[str], tbl: str, runs: str, command: str) -> str:
    settings = (
        f"- settings: (a) {args.raw_size:,} entries; (b) {args.size:,} instances,"
        f" {EXECUTORS} executors `--concurrency {args.concurrency}`, pre-published"
        f" `{args.publish}`; (c) {args.rate:g}/s with {publishers_for(args.rate)} publisher"
        f" process(es), (c') {args.low_rate:g}/s, {args.seconds:g} s each; (d) default"
        f" settings; {args.runs} run(s) of each"
    )
    return "\n".join(
        [
            BEGIN,
            "<!-- Written by scripts/bench; edit outside these markers. -->",
            "",
            f"Command: `{command}`",
            "",
            *facts,
            settings,
            "",
            tbl,
            "",
            "Each run:",
            "",
            runs,
            "",
            END,
        ]
    )


def write_doc(path: Path, generated: str) -> None:
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated + tail
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    svc = Services.from_env()
    command = os.environ.get("BENCH_COMMAND") or "python -m bench " + " ".join(sys.argv[1:])
    logdir = Path(tempfile.mkdtemp(prefix="taskstream-bench-"))
    say(f"logs of the roles: {logdir}")
    started = time.monotonic()
    head = _git_head()
    results = asyncio.run(run_all(args, svc, logdir))
    if (now := _git_head()) != head:
        head = f"{head} (the checkout moved to {now} during the run)"
    facts = asyncio.run(machine(svc, head))
    tbl = table(rows(results, args))
    runs = per_run(results)
    sys.stdout.write("\n".join(facts) + "\n\n" + tbl + "\n\n" + runs + "\n")
    if args.profile is not None and args.profile.exists():
        sys.stdout.write("\n" + summarize(args.profile, 30, None) + "\n")
    if args.doc is not None:
        write_doc(args.doc, document(args, facts, tbl, runs, command))
        say(f"wrote {args.doc}")
    if not args.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    say(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
