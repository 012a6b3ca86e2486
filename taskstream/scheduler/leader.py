"""Leader lease for schedulers: one active scheduler, the others hot standbys.

The lease is one Redis key holding `owner|token`, set with a TTL by one Lua script (the Redis
server's clock, so host clock skew cannot stretch it). Each new holder gets a fencing token
from a counter that only grows; the scheduler conditions its cursor writes, decision records and
instance creations on that token, so a stale leader (paused past its lease) has its writes
rejected (`Fenced`) and steps down. The store's UNIQUE dedupe key makes a double fire harmless
even without the lease.
"""

from __future__ import annotations

from typing import Any, Final

from taskstream.core import notify, streams
from taskstream.core.denials import commands
from taskstream.core.errors import TaskstreamError
from taskstream.core.protocol import Keys

_ACQUIRE: Final = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  local token = redis.call('INCR', KEYS[2])
  local floor = tonumber(ARGV[3])
  if token <= floor then
    token = floor + 1
    redis.call('SET', KEYS[2], token)
  end
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
  return {token, 0}
end
local sep = string.find(cur, '|', 1, true)
if sep and string.sub(cur, 1, sep - 1) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {tonumber(string.sub(cur, sep + 1)), 0}
end
return {0, redis.call('PTTL', KEYS[1])}
"""

_RELEASE: Final = """
local cur = redis.call('GET', KEYS[1])
if cur and cur == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Fenced(TaskstreamError):
    """Another scheduler holds the lease now: this one must stop deciding."""

    @classmethod
    def refused(cls, what: str, task_id: str) -> Fenced:
        """The error for a write (`what`: "cursor", "decision", "instance") of task `task_id`
        that the store refused because a newer leader token holds the task."""
        return cls(f"{what} of {task_id} refused: a newer leader token holds the task")


class LeaderLease:
    """Acquire-or-renew and release of the scheduler lease for one owner."""

    def __init__(self, redis: streams.Redis, keys: Keys, owner: str, *, lease_ms: int) -> None:
        if "|" in owner:
            raise ValueError("owner must not contain '|'")
        self._redis, self._keys, self.owner, self.lease_ms = redis, keys, owner, lease_ms
        self._acquire: Any = redis.register_script(_ACQUIRE)
        self._release: Any = redis.register_script(_RELEASE)
        self.token: int | None = None
        self.lapses_in_ms: int | None = None
        """After a `hold` that found another holder: how long its lease has left (ms, the
        Redis server's clock), so a standby tries again the moment it lapses."""

    @commands("EVALSHA (GET INCR SET PEXPIRE PTTL)")
    async def hold(self, *, floor: int = 0) -> int | None:
        """Acquire the lease or renew ours; returns our fencing token, or None (standby). A
        new token is above `floor` (the largest token the store has seen): after Redis lost
        the counter, the first leader does not wait for it to climb back."""
        token, left_ms = (
            int(x)
            for x in await self._acquire(
                keys=[self._keys.leader, self._keys.leader_epoch],
                args=[self.owner, self.lease_ms, floor],
            )
        )
        self.token = token if token > 0 else None
        # PTTL is -1 for a key without a time to live, which only a hand-made key has.
        self.lapses_in_ms = None if token > 0 else (left_ms if left_ms >= 0 else self.lease_ms)
        return self.token

    @commands("EVALSHA (GET DEL)")
    async def release(self) -> None:
        """Give the lease up now (if still ours), and wake the standbys (a hint on the control
        channel) so one takes over without waiting for its next try."""
        released = 0
        if self.token is not None:
            held = f"{self.owner}|{self.token}"
            released = int(await self._release(keys=[self._keys.leader], args=[held]))
        self.token = None
        if released:
            await notify.hint(self._redis, self._keys, "leader")

    @commands("GET")
    async def holder(self) -> tuple[str, int] | None:
        """Who holds the lease now, and with which token."""
        raw = await self._redis.get(self._keys.leader)
        if raw is None:
            return None
        owner, _, token = streams.as_text(raw).rpartition("|")
        return owner, int(token)
