"""Lua scripts of the Redis backends: the rules of `window` and `breaker`, line for line.

Every script reads the Redis server's clock (`TIME`, in ms), so executors with skewed clocks
still share one timeline; scripts are atomic, so concurrent callers never interleave. Reading
`TIME` before writing needs scripts replicated by effects: Redis >= 5 (or Valkey).

Limiter: KEYS[1] is a sorted set of hits, score = hit time (ms), member = `<ms>:<token>` where
the token is unique per call, so two hits in the same millisecond are two members. ARGV is
(limit, window_ms, burst, token). Reply: {allowed 0|1, retry_after_ms, in_window}, and the
hit's member when allowed. `LIMITER_RESTAMP` moves one hit to now (`window.restamped`):
ARGV is (window_ms, member); reply 1 when the hit was still in the window ending now (and
is now at now), 0 when it was not (gone, or older than the window: stale, and removed, as its
call is not sent).
`LIMITER_USAGE` reads the same key without writing: ARGV is (window_ms,); reply
{used, in_horizon, now_ms}, the hits in the window and in twice the window ending now.

Breaker: KEYS[1] is a hash whose fields are the `BreakerState` field names. ARGV starts with
the `BreakerConfig` fields in declaration order; `record` adds the outcome and the probe's
round (its half-open `since_ms`; empty when the call was not a probe). Reply:
{allowed, probe, retry_after_ms, status before, then every `BreakerState` field in order};
`record` replies 0, 0, 0 for the first three. The hash has no TTL: a breaker's state survives
any quiet period, and there is one small hash per upstream. A hash whose `status` is not one of
ours is read as a fresh (closed) breaker, and a counter that is not 1 to `COUNTER_DIGITS` ASCII
digits as 0, as `redis_backend.state_from_hash` reads them; the next write replaces them.
"""

from __future__ import annotations

from dataclasses import fields
from string import Template
from typing import Final

from taskstream.ratelimit.breaker import BreakerState, BreakerStatus, Outcome
from taskstream.ratelimit.breaker_config import BreakerConfig

STATE_FIELDS: Final = tuple(f.name for f in fields(BreakerState))
"""Hash fields and reply order: `status` first, then the integer counters."""
COUNTER_FIELDS: Final = STATE_FIELDS[1:]
COUNTER_DIGITS: Final = 15
"""Most digits of a counter read from a breaker hash: every one is then an exact integer in
Lua's doubles (below 2**53), and written back as digits, never as `1e+30`."""
CONFIG_FIELDS: Final = tuple(f.name for f in fields(BreakerConfig))
"""ARGV order of the breaker scripts' configuration."""

LIMITER: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, window, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local horizon = 2 * window
local window_floor = '(' .. (now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - horizon)
local in_window = redis.call('ZCOUNT', KEYS[1], window_floor, '+inf')
local total = redis.call('ZCARD', KEYS[1])
local wait = 0
if in_window >= limit + burst then
  local skip = in_window - limit - burst
  local hit = redis.call('ZRANGEBYSCORE', KEYS[1], window_floor, '+inf',
    'WITHSCORES', 'LIMIT', skip, 1)
  wait = math.max(1, tonumber(hit[2]) + window - now)
end
if total >= 2 * limit then
  local at = total - 2 * limit
  local hit = redis.call('ZRANGE', KEYS[1], at, at, 'WITHSCORES')
  wait = math.max(wait, 1, tonumber(hit[2]) + horizon - now)
end
if wait > 0 then
  return {0, wait, in_window}
end
local member = now .. ':' .. ARGV[4]
redis.call('ZADD', KEYS[1], now, member)
redis.call('PEXPIRE', KEYS[1], horizon)
return {1, 0, in_window + 1, member}
"""

LIMITER_RESTAMP: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local score = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not score then
  return 0
end
if tonumber(score) <= now - window then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 0
end
if tonumber(score) < now then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], 2 * window)
end
return 1
"""

LIMITER_USAGE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local used = redis.call('ZCOUNT', KEYS[1], '(' .. (now - window), '+inf')
local in_horizon = redis.call('ZCOUNT', KEYS[1], '(' .. (now - 2 * window), '+inf')
return {used, in_horizon, now}
"""

_BREAKER_PRELUDE: Final = Template("""
local CLOSED, OPEN, HALF_OPEN = '$closed', '$open', '$half_open'
local FAILURE, IGNORE = '$failure', '$ignore'
local COUNTERS = {$counters}
local CONFIG = {$config}
local key = KEYS[1]
local cfg = {}
for i, name in ipairs(CONFIG) do cfg[name] = tonumber(ARGV[i]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function fresh(status)
  local s = {status = status}
  for _, name in ipairs(COUNTERS) do s[name] = 0 end
  s.since_ms = now
  s.window_start_ms = now
  return s
end

local function load()
  local s = fresh(CLOSED)
  s.since_ms = 0
  s.window_start_ms = 0
  local raw = redis.call('HGETALL', key)
  local read = {}
  for i = 1, #raw, 2 do read[raw[i]] = raw[i + 1] end
  local status = read.status or CLOSED
  if status ~= CLOSED and status ~= OPEN and status ~= HALF_OPEN then return s end
  s.status = status
  for _, name in ipairs(COUNTERS) do
    local value = read[name]
    if value and #value <= $counter_digits and string.match(value, '^%d+$$') then
      s[name] = tonumber(value)
    end
  end
  return s
end

local function save(s)
  local args = {'status', s.status}
  for _, name in ipairs(COUNTERS) do
    args[#args + 1] = name
    args[#args + 1] = s[name]
  end
  redis.call('HSET', key, unpack(args))
end

local function reply(allowed, probe, wait, before, s)
  local out = {allowed, probe, wait, before, s.status}
  for _, name in ipairs(COUNTERS) do out[#out + 1] = s[name] end
  return out
end
""")

_BREAKER_ADMIT: Final = """
local s = load()
local before = s.status
if s.status == CLOSED then return reply(1, 0, 0, before, s) end
if s.status == OPEN then
  local reopen_at = s.since_ms + cfg.cooldown_ms
  if now < reopen_at then return reply(0, 0, reopen_at - now, before, s) end
  s = fresh(HALF_OPEN)
elseif s.probe_successes >= cfg.probes then
  s = fresh(CLOSED)
  save(s)
  return reply(1, 0, 0, before, s)
elseif now >= math.max(s.since_ms, s.last_probe_ms) + cfg.probe_timeout_ms then
  s.since_ms = now
  s.probes_admitted = s.probe_successes
end
if s.probes_admitted >= cfg.probes then
  save(s)
  local lost_at = math.max(s.since_ms, s.last_probe_ms) + cfg.probe_timeout_ms
  return reply(0, 0, math.max(1, lost_at - now), before, s)
end
s.probes_admitted = s.probes_admitted + 1
s.last_probe_ms = now
save(s)
return reply(1, 1, 0, before, s)
"""

_BREAKER_RECORD: Final = """
local outcome = ARGV[#CONFIG + 1]
local probe_round = tonumber(ARGV[#CONFIG + 2])

local function count(s, failed)
  if now >= s.window_start_ms + cfg.window_ms then
    s.window_start_ms = now
    s.window_calls = 0
    s.window_failures = 0
  end
  s.window_calls = s.window_calls + 1
  if failed then
    s.window_failures = s.window_failures + 1
    s.consecutive_failures = s.consecutive_failures + 1
  else
    s.consecutive_failures = 0
  end
  local rate_ppm = math.floor(cfg.failure_rate * 1000000 + 0.5)
  local rate_tripped = s.window_calls >= cfg.min_calls
    and s.window_failures * 1000000 >= rate_ppm * s.window_calls
  if s.consecutive_failures >= cfg.failure_threshold or rate_tripped then return fresh(OPEN) end
  return s
end

local function probe_result(s)
  if outcome == IGNORE then
    s.probes_admitted = math.max(0, s.probes_admitted - 1)
    return s
  end
  if outcome == FAILURE then return fresh(OPEN) end
  s.probe_successes = s.probe_successes + 1
  if s.probe_successes >= cfg.probes then return fresh(CLOSED) end
  return s
end

local s = load()
local before = s.status
if s.status == HALF_OPEN then
  if probe_round ~= s.since_ms then return reply(0, 0, 0, before, s) end
  s = probe_result(s)
elseif s.status == OPEN or outcome == IGNORE then
  return reply(0, 0, 0, before, s)
else
  s = count(s, outcome == FAILURE)
end
save(s)
return reply(0, 0, 0, before, s)
"""


def _lua_list(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def _prelude() -> str:
    return _BREAKER_PRELUDE.substitute(
        closed=BreakerStatus.CLOSED.value,
        open=BreakerStatus.OPEN.value,
        half_open=BreakerStatus.HALF_OPEN.value,
        failure=Outcome.FAILURE.value,
        ignore=Outcome.IGNORE.value,
        counters=_lua_list(COUNTER_FIELDS),
        config=_lua_list(CONFIG_FIELDS),
        counter_digits=COUNTER_DIGITS,
    )


BREAKER_ADMIT: Final = _prelude() + _BREAKER_ADMIT
BREAKER_RECORD: Final = _prelude() + _BREAKER_RECORD
