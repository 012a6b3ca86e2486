"""Summarise a py-spy `--format raw` profile (collapsed stacks: `frame;frame;... count`).

    python -m bench.profile FILE [--top 25] [--match taskstream]

Prints the functions with the most samples on top of the stack (self), and the functions
present anywhere in the stack (inclusive), as shares of all samples; idle samples (the event
loop waiting in `select`/`epoll`) are counted separately so that the shares are of busy time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _name(frame: str, lines: bool = False) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match.group("file") if not lines else frame.strip().rsplit("(", 1)[1].rstrip(")")
    for marker in ("site-packages/", "lib/python3", f"{ROOT}/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match.group('func')} ({file})"


def load(path: Path, lines: bool = False) -> list[tuple[list[str], int]]:
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks.append(([_name(f, lines) for f in stack.split(";")], int(count)))
    return stacks


def _idle(frames: list[str]) -> bool:
    return "selectors.py" in frames[-1] and "select" in frames[-1]


def _startup(frames: list[str]) -> bool:
    return any("<frozen importlib" in f for f in frames)


def summarize(path: Path, top: int, match: str | None, lines: bool = False) -> str:
    stacks = load(path, lines)
    total = sum(c for _, c in stacks)
    idle = sum(c for f, c in stacks if _idle(f))
    startup = sum(c for f, c in stacks if _startup(f))
    busy = [(f, c) for f, c in stacks if not _idle(f) and not _startup(f)]
    busy_total = sum(c for _, c in busy) or 1
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for frames, count in busy:
        own[frames[-1]] += count
        for name in set(frames):
            incl[name] += count
    out = [
        f"{path}: {total} samples: {busy_total} busy, {idle} idle in the event loop's"
        f" select, {startup} importing modules at start-up (both left out below)",
        "",
        f"self (top {top}, share of busy samples):",
    ]
    out += [f"  {c / busy_total:6.1%}  {name}" for name, c in own.most_common(top)]
    out += ["", f"inclusive (top {top}{f', matching {match!r}' if match else ''}):"]
    chosen = [(n, c) for n, c in incl.most_common() if match is None or match in n]
    out += [f"  {c / busy_total:6.1%}  {name}" for name, c in chosen[:top]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default=None)
    parser.add_argument("--lines", action="store_true", help="keep line numbers")
    args = parser.parse_args(argv)
    sys.stdout.write(summarize(args.file, args.top, args.match, args.lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
