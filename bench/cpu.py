"""CPU accounting from /proc: who used the machine's cores during a measurement.

Two snapshots of every process's user+system time; the difference is split into the
benchmark's executors, the rest of the benchmark (this process and its other descendants:
publishers, raw consumers, scheduler, sweeper), MariaDB, Redis, and everything else on the
machine ("foreign": other people's tests and tools, which this shared machine does run). MariaDB
and Redis are shared services, so their figures include any foreign load on them. Processes that
start and end between two snapshots are not seen.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CATEGORIES = ("executor", "bench", "mariadb", "redis", "foreign")


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    busy: dict[int, float]
    """pid -> CPU seconds used so far."""
    parent: dict[int, int]
    kind: dict[int, str]


def _read(pid: int) -> tuple[int, str, float] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    # after the comm: state ppid ... utime is field 14 of the whole line, index 11 here
    ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
    return ppid, f"{comm} {cmdline}", (utime + stime) / TICK


def snapshot() -> Snapshot:
    busy: dict[int, float] = {}
    parent: dict[int, int] = {}
    kind: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        read = _read(pid)
        if read is None:
            continue
        parent[pid], name, busy[pid] = read
        kind[pid] = _kind(name)
    return Snapshot(time.monotonic(), busy, parent, kind)


def _kind(name: str) -> str:
    if name.startswith(("mariadbd", "mysqld")):
        return "mariadb"
    if name.startswith(("redis-server", "redis-serv")):
        return "redis"
    if "taskstream executor" in name:
        return "executor"
    return "other"


def _descends(pid: int, root: int, parent: dict[int, int]) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == root:
            return True
        pid = parent.get(pid, 0)
        seen += 1
    return False


def usage(before: Snapshot, after: Snapshot, root: int | None = None) -> dict[str, float]:
    """CPU seconds per category between two snapshots (`root`: the benchmark's process)."""
    root = os.getpid() if root is None else root
    out = dict.fromkeys(CATEGORIES, 0.0)
    for pid, busy in after.busy.items():
        used = busy - before.busy.get(pid, 0.0)
        if used <= 0:
            continue
        kind = after.kind.get(pid, "other")
        if kind in ("mariadb", "redis"):
            out[kind] += used
        elif _descends(pid, root, after.parent):
            out["executor" if kind == "executor" else "bench"] += used
        else:
            out["foreign"] += used
    out["seconds"] = after.at - before.at
    return out


def foreign_load(sample_s: float = 1.0) -> float:
    """Cores used by processes outside the benchmark (and outside MariaDB/Redis) right now."""
    before = snapshot()
    time.sleep(sample_s)
    after = snapshot()
    used = usage(before, after)
    return used["foreign"] / used["seconds"] if used["seconds"] > 0 else 0.0
