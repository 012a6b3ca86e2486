"""`python -m bench`: run every benchmark, print the results table, write docs/benchmarks.md.

    scripts/bench            3 runs of each figure (about 7 minutes), writes docs/benchmarks.md
    scripts/bench --quick    1 small run of each, prints only (a smoke check)

(a), (a2) and (b) run in turn, a then a2 then b, so that drift of the shared machine hits
them alike; the ratios (b)/(a), (a2)/(a) and (b)/(a2) are computed per run. Before each
measurement the run waits (at most 30 s) for the machine to be quiet: this host is shared, and
the CPU other processes use during each run is reported next to the figures.
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
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from bench import cpu
from bench.common import ROOT, Services, mysql_value, say
from bench.drain import EXECUTORS, run_drain
from bench.latency import run_latency
from bench.profile import summarize
from bench.raw import run_raw
from bench.raw_store import BATCH as RAW_STORE_BATCH
from bench.raw_store import run_raw_store
from bench.recovery import run_recovery
from bench.report import Results, per_run, rows, table

BEGIN = "<!-- bench:results:begin -->"
END = "<!-- bench:results:end -->"
QUIET_CORES = 0.3
QUIET_WAIT_S = 30.0


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
    p.add_argument("--only", default="a2bcd", help="which of a, 2 (a2), b, c, d to run")
    p.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="results file (default docs/benchmarks.md, written by full runs only)",
    )
    p.add_argument("--no-doc", action="store_true", help="do not write the results file")
    p.add_argument("--profile", type=Path, default=None, help="py-spy one more (b) to FILE")
    p.add_argument("--keep-logs", action="store_true", help="keep the roles' logs")
    args = p.parse_args(argv)
    full = _full_run(p, args)
    quick = bool(args.quick)
    args.runs = args.runs or (1 if quick else 3)
    args.raw_size = args.raw_size or (5_000 if quick else 50_000)
    args.size = args.size or (2_000 if quick else 20_000)
    args.seconds = args.seconds or (5.0 if quick else 20.0)
    if args.doc is None and full and not args.no_doc:
        args.doc = ROOT / "docs" / "benchmarks.md"
    if args.no_doc:
        args.doc = None
    return args


_SHAPE = ("only", "raw_size", "size", "seconds", "concurrency", "publish", "rate", "low_rate")
"""The options that change what is measured (which figures, sizes, rates, concurrency)."""


def _full_run(p: argparse.ArgumentParser, args: argparse.Namespace) -> bool:
    """Whether `args` (as parsed, before the sizes are filled in) ask for every figure at the
    default settings and at least 3 runs: only such a run replaces the recorded results by
    default, since a partial or resized one would leave its table without figures."""
    reshaped = any(getattr(args, name) != p.get_default(name) for name in _SHAPE)
    return not (args.quick or reshaped) and (args.runs is None or args.runs >= 3)


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
        await _throughput(args, svc, logdir, r, i)
    rates = [("c", args.rate, 1, r.latency), ("c2", args.rate, 2, r.latency2)]
    if args.low_rate > 0:
        rates.append(("c-low", args.low_rate, 1, r.low))
    for letter, rate, executors, out in rates:
        if "c" not in only:
            break
        for i in range(args.runs):
            say(f"(c) {rate:g}/s, {executors} executor(s), run {i + 1}/{args.runs}")
            await quiet(letter, r)
            out.append(
                await run_latency(
                    svc,
                    rate=rate,
                    seconds=args.seconds,
                    concurrency=args.concurrency,
                    publishers=publishers_for(rate),
                    executors=executors,
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


async def _throughput(
    args: argparse.Namespace, svc: Services, logdir: Path, r: Results, i: int
) -> None:
    """Run `i` of (a), (a2) and (b), in that order, as `--only` selects."""
    only = str(args.only)
    if "a" in only:
        say(f"(a) run {i + 1}/{args.runs}")
        await quiet("a", r)
        r.raw.append(await run_raw(svc, args.raw_size))
    if "2" in only:
        say(f"(a2) run {i + 1}/{args.runs}")
        await quiet("a2", r)
        r.raw_store.append(await run_raw_store(svc, args.size))
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


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# the table


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
        f"- settings: (a) {args.raw_size:,} entries; (a2) {args.size:,} instances, batches of"
        f" {RAW_STORE_BATCH}; (b) {args.size:,} instances,"
        f" {EXECUTORS} executors `--concurrency {args.concurrency}`, pre-published"
        f" `{args.publish}`; (c) {args.rate:g}/s with {publishers_for(args.rate)} publisher"
        f" process(es) and 1 executor, (c2) the same with 2 executors, (c') {args.low_rate:g}/s"
        f" with 1 executor, {args.seconds:g} s each; (d) default"
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
