"""Hosts made of Linux network namespaces, for partition tests (root only).

Each `Host` is a namespace of its own joined to the root namespace by a veth pair with a /30
of 10.251.0.0/16: the root side holds `.1` (`root_addr`, where the host reaches the "core":
Redis, the database), the namespace side `.2`. Names carry a random suffix, and a /30 no
interface of this machine holds is picked, so parallel runs do not collide. Only what
`hosts()` made is ever touched: its namespaces, their veth pairs, and the processes running
inside its namespaces (killed at the end, before the namespaces are deleted).

A partition is `host.cut()`: the root side of the pair goes down, so the host's packets
vanish. Open TCP connections get no reset: their calls hang until the caller's own timeout,
and their bytes are delivered once `host.heal()` brings the link up again (TCP retransmits).
New connections fail after ARP gives up (about 3 s, "No route to host").
`host.drop()` is the other kind: the link stays up but every frame either side sends is
addressed to a MAC no one has, so the host's new connections hang too (their SYN is lost).
(No netem or packet filter is needed: neither is in every kernel.)
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy.engine import make_url

IP = "ip"
NET = "10.251"
_CMD_TIMEOUT_S = 10.0
_NOWHERE = ("lladdr", "02:00:5e:00:00:01", "nud", "permanent")
"""A neighbour entry sending frames to a locally administered MAC no interface has."""


def unavailable() -> str | None:
    """Why partition tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns)"
    if shutil.which(IP) is None:
        return "the `ip` command (iproute2) is not installed"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), check=check, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S
    )


@dataclass(frozen=True)
class Host:
    """One namespace ("host") joined to the root namespace."""

    netns: str
    root_if: str
    host_if: str
    root_addr: str
    addr: str

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace."""
        return [IP, "netns", "exec", self.netns, *argv]

    def cut(self) -> None:
        """Partition the host: its link goes down, packets vanish, no reset is sent."""
        _run(IP, "link", "set", self.root_if, "down")

    def heal(self) -> None:
        """Undo `cut` or `drop`."""
        _run(IP, "link", "set", self.root_if, "up")
        _run(IP, "neigh", "del", self.addr, "dev", self.root_if, check=False)
        self._inside("neigh", "del", self.root_addr, "dev", self.host_if, check=False)

    def drop(self) -> None:
        """Partition the host with its link up: each side sends its frames to a MAC address
        no one has (a permanent neighbour entry), so the other drops them, silently."""
        _run(IP, "neigh", "replace", self.addr, *_NOWHERE, "dev", self.root_if)
        _run(
            IP, "-n", self.netns, "neigh", "replace", self.root_addr, *_NOWHERE, "dev", self.host_if
        )

    def _inside(self, *args: str, check: bool = True) -> None:
        _run(IP, "-n", self.netns, *args, check=check)

    def url(self, url: str, port: int | None = None) -> str:
        """`url` (Redis or database) pointing at the root side of this host's link, on `port`
        when given (a forwarder's) or on the URL's own."""
        parsed = make_url(url)
        moved = parsed.set(host=self.root_addr, port=port or parsed.port)
        return moved.render_as_string(hide_password=False)

    def pids(self) -> list[int]:
        """The processes running inside the namespace."""
        done = _run(IP, "netns", "pids", self.netns, check=False)
        return [int(p) for p in done.stdout.split()]


def _taken_subnets() -> set[str]:
    """The /30 of 10.251 of every IPv4 address on this machine's root namespace."""
    out = _run(IP, "-4", "-o", "addr", "show").stdout
    taken = set()
    for line in out.splitlines():
        for word in line.split():
            if word.startswith(f"{NET}."):
                third, fourth = word.split("/")[0].split(".")[2:]
                taken.add(f"{third}.{int(fourth) & ~3}")
    return taken


def _make(tag: str, index: int, subnet: str) -> Host:
    third, base = subnet.split(".")
    root_addr, addr = f"{NET}.{third}.{int(base) + 1}", f"{NET}.{third}.{int(base) + 2}"
    host = Host(f"ts-{tag}-{index}", f"ts{tag}{index}r", f"ts{tag}{index}h", root_addr, addr)
    _run(IP, "netns", "add", host.netns)
    _run(IP, "link", "add", host.root_if, "type", "veth", "peer", "name", host.host_if)
    _run(IP, "link", "set", host.host_if, "netns", host.netns)
    _run(IP, "addr", "add", f"{root_addr}/30", "dev", host.root_if)
    _run(IP, "link", "set", host.root_if, "up")
    _run(IP, "-n", host.netns, "addr", "add", f"{addr}/30", "dev", host.host_if)
    _run(IP, "-n", host.netns, "link", "set", host.host_if, "up")
    _run(IP, "-n", host.netns, "link", "set", "lo", "up")
    return host


def _remove(host: Host) -> None:
    """Kill what runs in the host's namespace, then delete it and its veth pair."""
    for pid in host.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while host.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    _run(IP, "netns", "del", host.netns, check=False)
    _run(IP, "link", "del", host.root_if, check=False)


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts made for the block and removed after it, whatever happens in it."""
    tag = uuid.uuid4().hex[:6]
    taken = _taken_subnets()
    free = [f"{t}.{b}" for t in range(256) for b in range(0, 256, 4) if f"{t}.{b}" not in taken]
    made: list[Host] = []
    try:
        for index, subnet in enumerate(random.sample(free, count)):
            made.append(_make(tag, index, subnet))
        yield made
    finally:
        for host in made:
            _remove(host)
        for index in range(len(made), count):  # one whose making failed half-way
            _remove(Host(f"ts-{tag}-{index}", f"ts{tag}{index}r", "", "", ""))
