"""Admission control state in Redis for the Messaging API: token buckets, the backlog signal
and P0's latency signal.

A bucket is a Redis hash ``{prefix}admission:{name}`` with fields ``tokens`` (float) and
``ts`` (Redis time of the last update, seconds). One Lua script checks several buckets at
once and takes a token from each only when every one has it, so a request refused by one
limit spends nothing from the others. The clock is Redis ``TIME``; a clock that steps back
refills nothing. A key expires once its bucket would be full again (a missing key is a full
bucket). This is a simpler limiter than the send-capacity limiter of ``adapters/ratelimit/``:
no tier borrowing, no leases, one token per request.

Every call is bounded by a short timeout (``Settings.api_redis_timeout``: shorter for the
priority lane); after a failure Redis is not asked again for :data:`DOWN_BACKOFF_S` and calls
raise :class:`AdmissionUnavailable` at once, so an outage costs a request no latency. The
process's idempotency fences share that knowledge (one
:class:`~notiflow.adapters.redis_health.RedisHealth`). The caller decides whether to fail
open or closed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from notiflow.adapters.backlog import oldest_age
from notiflow.adapters.pressure import worst
from notiflow.adapters.redis_health import RedisHealth, RedisUnreachable
from notiflow.adapters.redis_pool import reconnect_once, redis_client
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

REDIS_TIMEOUT_S = 0.25
DOWN_BACKOFF_S = 1.0
BACKLOG_CACHE_S = 1.0
PRESSURE_CACHE_S = 0.25

_TAKE = """
local cost = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels, stamps = {}, {}
local denied, wait = 0, 0
for i = 1, #KEYS do
  local rate = tonumber(ARGV[2 * i])
  local burst = tonumber(ARGV[2 * i + 1])
  local b = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local level, ts = tonumber(b[1]), tonumber(b[2])
  if level == nil or ts == nil then
    level, ts = burst, now
  end
  if now > ts then
    level = level + (now - ts) * rate
    ts = now
  end
  if level > burst then level = burst end
  levels[i], stamps[i] = level, ts
  if level < cost then
    if denied == 0 then denied = i end
    local w = (cost - level) / rate
    if w > wait then wait = w end
  end
end
for i = 1, #KEYS do
  local level = levels[i]
  if denied == 0 then level = level - cost end
  local rate = tonumber(ARGV[2 * i])
  local burst = tonumber(ARGV[2 * i + 1])
  redis.call('HSET', KEYS[i], 'tokens', tostring(level), 'ts', tostring(stamps[i]))
  redis.call('PEXPIRE', KEYS[i], math.ceil((burst - level) / rate * 1000) + 1000)
end
return {denied, tostring(wait)}
"""


class AdmissionUnavailable(RuntimeError):
    """Redis did not answer (or failed recently): admission state is unknown."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """``rate`` tokens per second, holding at most ``burst``."""

    key: str
    rate: float
    burst: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of :meth:`AdmissionStore.take`: ``denied`` is the index of the first bucket
    without a token (None when admitted); ``wait_s`` the time until every bucket has one."""

    denied: int | None
    wait_s: float

    @property
    def admitted(self) -> bool:
        return self.denied is None


def one_second_bucket(key: str, rate: float) -> Bucket:
    """A bucket of ``rate``/s whose burst is one second's worth (at least one token)."""
    return Bucket(key, rate, max(rate, 1.0))


def retry_after_s(wait_s: float) -> int:
    """Whole seconds for ``Retry-After``: rounded up, at least 1."""
    return max(1, math.ceil(wait_s - 1e-9))


class AdmissionStore:
    """Token buckets and the cached backlog signal of one API process."""

    def __init__(self, client: aioredis.Redis, prefix: str, *,
                 timeout_s: float = REDIS_TIMEOUT_S, down_backoff_s: float = DOWN_BACKOFF_S,
                 backlog_cache_s: float = BACKLOG_CACHE_S,
                 clock: Callable[[], float] = time.monotonic,
                 health: RedisHealth | None = None) -> None:
        self.r = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.backlog_cache_s = backlog_cache_s
        self.clock = clock
        self.health = health or RedisHealth(down_backoff_s, clock)
        self._take = client.register_script(_TAKE)
        self._backlog: dict[Tier, tuple[float, float | None]] = {}
        self._backlog_locks: dict[Tier, asyncio.Lock] = {}
        self._pressure: tuple[float, float | None] = (-PRESSURE_CACHE_S, None)
        self._pressure_lock = asyncio.Lock()

    @classmethod
    def open(cls, settings: Settings) -> AdmissionStore:
        """A store with its own client, which reconnects once on a closed connection (a
        bucket script run twice spends a token twice: the error is on the safe side), its
        calls bounded by the lane's ``api_redis_timeout``."""
        timeout = settings.api_redis_timeout.of(settings.api_lane).total_seconds()
        client = redis_client(settings, timeout=timeout, pool_wait=timeout,
                              retry=reconnect_once())
        return cls(client, settings.topic_prefix, timeout_s=timeout)

    def tenant_key(self, tenant_id: str) -> str:
        return f"{self.prefix}admission:tenant:{tenant_id}"

    def p0_key(self, channel: Channel) -> str:
        return f"{self.prefix}admission:p0:{Channel(channel).value}"

    async def _call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await self.health.ask(fn, self.timeout_s)
        except RedisUnreachable as exc:
            raise AdmissionUnavailable(str(exc)) from exc

    async def take(self, buckets: Sequence[Bucket], cost: float = 1.0) -> Verdict:
        """Take ``cost`` tokens from every bucket, or from none (atomic)."""
        if not buckets:
            return Verdict(None, 0.0)
        args: list[float] = [cost]
        for b in buckets:
            args += [b.rate, b.burst]
        denied, wait = await self._call(
            lambda: self._take(keys=[b.key for b in buckets], args=args))
        index = int(denied)
        return Verdict(None if index == 0 else index - 1, float(wait))

    async def backlog_age(self, tier: Tier) -> float | None:
        """Age in seconds of ``tier``'s oldest unsent message (``adapters.backlog``), fetched
        at most once per :data:`BACKLOG_CACHE_S`; concurrent callers share one fetch."""
        cached = self._backlog.get(tier)
        if cached is not None and self.clock() - cached[0] < self.backlog_cache_s:
            return cached[1]
        lock = self._backlog_locks.setdefault(tier, asyncio.Lock())
        async with lock:
            cached = self._backlog.get(tier)
            if cached is not None and self.clock() - cached[0] < self.backlog_cache_s:
                return cached[1]
            age: float | None = await self._call(
                lambda: oldest_age(self.r, self.prefix, tier))
            self._backlog[tier] = (self.clock(), age)
            return age

    async def p0_worst(self) -> float | None:
        """P0's worst latency (``adapters.pressure``), fetched at most once per
        :data:`PRESSURE_CACHE_S`; concurrent callers share one fetch."""
        if self.clock() - self._pressure[0] < PRESSURE_CACHE_S:
            return self._pressure[1]
        async with self._pressure_lock:
            if self.clock() - self._pressure[0] < PRESSURE_CACHE_S:
                return self._pressure[1]
            value: float | None = await self._call(lambda: worst(self.r, self.prefix))
            self._pressure = (self.clock(), value)
            return value

    async def aclose(self) -> None:
        await self.r.aclose()
