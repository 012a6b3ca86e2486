"""Upstream protection: a shared sliding-window limiter and circuit breakers (DESIGN.md §8).

- `window`, `breaker`: the rules, as pure functions of (state, now, config).
- `backend`: the port (`Limiter`, `Breakers`) and its result types.
- `memory`: in-process backends on an injected clock; `redis_backend` (+ `lua`): the shared
  ones, on the Redis server's clock.
- `metrics`: Prometheus counters and gauges the backends update (refusals, breaker states and
  transitions).

This package imports nothing at import time, so the pure modules stay free of I/O.
"""
