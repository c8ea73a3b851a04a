"""Cluster-wide send capacity: provider rate, tier reservations, tenant rate — one Lua call.

Every send worker asks :class:`CapacityLimiter` before each provider call. The limiter spends
tokens from a small local lease and refills it from Redis, where one script decides per call,
atomically, on Redis's clock (``TIME``; tests pass ``now_us`` instead):

Provider account ``p`` (contracted rate ``R`` requests/s, window ``W`` = 1 s)
    A sliding-window log per (provider, tier). Each request adds one entry
    ``{seq}:{demand}:{granted}`` scored by its time in µs; entries older than ``W`` are
    dropped. Guarantee (a): for every grant at time ``g``, the regular grants of all tiers in
    ``(g - W, g]`` total at most ``R``.

    *Proof.* Decision times never decrease (``now`` is clamped to the last decision time), and
    a request is granted ``k`` only if the grants already logged in ``(g - W, g]`` plus ``k``
    fit under ``R`` (the last prefix below, ``P_3 = R``). Take any window ``(a - W, a]`` and
    its last decided grant, at ``g* <= a``: every grant in the window was decided no later and
    lies in ``(a - W, g*] ⊆ (g* - W, g*]``, which held at most ``R`` right after ``g*``. So no
    window of length ``W`` ever holds more than ``R`` grants. ∎ The same argument bounds the
    P0 emergency log by ``p0_emergency_rate``.

Tier reservations (capacities ``S_h = share_h · R``, prefix sums ``P_m = S_0 + … + S_m``)
    Tier ``t`` may be granted ``k`` iff for every ``m >= t``::

        Σ_{h<t} max(G_h, min(D_h, S_h)) + Σ_{t<=h<=m} G_h + k <= P_m

    where ``G_h`` / ``D_h`` are tier ``h``'s grants / demand (asked tokens, granted or not) in
    the window. ``m = t`` is the design rule "own share plus the unused share of every higher
    tier" (``unused_h = S_h - min(D_h, S_h)``); ``m > t`` stops two lower tiers from both
    borrowing the same unused share (which would eat a still lower tier's reservation);
    ``m = 3`` is the provider limit, with the outstanding reservations of higher tiers in
    demand held back. Lower tiers' reservations never hold back a higher tier.

    Guarantee (b): if P0's demand in ``(g - W, g]`` was at least ``S_0`` at every lower-tier
    grant ``g`` in ``(T - W, T]``, a P0 request of ``n`` at ``T`` is granted
    ``min(n, ⌊S_0 - G_0(T)⌋)`` (tenant limit aside): a P0 request is cut short only once P0
    holds its whole share ``⌊S_0⌋`` in the window. (For each ``m >= 1`` the last grant of
    tiers ``1..m`` in the window satisfied its ``m``-constraint with ``min(D_0, S_0) = S_0``,
    so ``Σ_{1<=h<=m} G_h(T) <= P_m - S_0``; argue as in (a).) Borrowed capacity therefore
    returns to P0 once P0's demand has stayed at or above its share for ``W``.

    Guarantee (c): a tier alone may use ``P_t`` — P3 alone the whole ``R``.

P0 emergency quota (``p0_emergency_rate`` ``E``)
    Extra contracted capacity only P0 may use, when the regular rule grants P0 less than it
    asked. Its own log; it does not count against ``R``: the provider sees at most ``R + E``.

Tenant (optional; rate ``r`` from the caller, e.g. ``TenantConfig.rate_limit``)
    A token bucket (rate ``r``, burst ``max(1, r · 1 s)``) in the same script: a call is
    granted ``k = min(asked, provider room, tenant tokens)`` and all three are charged ``k``
    together. Demand is counted only up to what the tenant could take, so a throttled tenant
    does not hold capacity back from lower tiers.

Time: rates are requests per (real) second and are NOT multiplied by ``time_scale`` — they
model contracts of real providers and emulators. A grant counts at its Redis time; a leased
token is spent up to the lease TTL later, so calls reaching the provider in a 1 s window may
also include tokens leased up to one TTL before it (at most one lease per worker).

Redis key layout (namespace = ``settings.topic_prefix``)::

    {ns}cap:{provider}:log:{P0..P3}  zset  score = µs, member = seq:demand:granted
    {ns}cap:{provider}:em            zset  P0 emergency grants, member = seq:granted
    {ns}cap:{provider}:meta          hash  last, seq, em, g0..g3, d0..d3 (window sums)
    {ns}cap:tenant:{tenant}          hash  tokens (%.17g), ts (µs)

:func:`decide` is the reference implementation in Python; the Lua script mirrors its
arithmetic operation for operation (same IEEE doubles), so both decide identically. The wait
search walks the logs in time order (Lua: merged in chunks); its result does not depend on the
order of entries with equal times, because expiring an entry never reduces a tier's room.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import redis.asyncio as aioredis
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from notiflow import names
from notiflow.adapters.redis_health import RedisHealth
from notiflow.adapters.redis_pool import redis_client
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from notiflow.token_bucket import TokenBucket

log = logging.getLogger(__name__)
_denials = names.RATELIMIT_DENIALS.create(metrics.get_meter(names.METER))

TIERS: tuple[Tier, ...] = (Tier.P0, Tier.P1, Tier.P2, Tier.P3)
WINDOW_US = 1_000_000
DOWN_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)
"""Errors that mean "Redis unreachable" (timeouts included)."""

RedisDown = Literal["local", "pause"]


# value objects ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderRule:
    """The capacity contract of one provider account.

    ``rate`` is requests per second (never scaled by ``time_scale``); ``shares`` are the tier
    reservations P0..P3 and must sum to 1; ``share_P0 · rate`` must be at least 1 so every
    tier can be granted a token on its own.
    """

    provider_id: str
    rate: float
    shares: tuple[float, float, float, float]
    emergency_rate: float = 0.0
    window_us: int = WINDOW_US

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"{self.provider_id}: rate must be > 0")
        if len(self.shares) != len(TIERS) or min(self.shares) < 0:
            raise ValueError(f"{self.provider_id}: need four shares >= 0")
        if abs(sum(self.shares) - 1.0) > 1e-6:
            raise ValueError(f"{self.provider_id}: tier shares must sum to 1")
        if self.shares[0] * self.rate < 1:
            raise ValueError(f"{self.provider_id}: P0 share * rate must be >= 1 request/s")
        if self.emergency_rate < 0 or self.window_us < 1000:
            raise ValueError(f"{self.provider_id}: bad emergency rate or window")

    @property
    def capacities(self) -> tuple[float, ...]:
        """``S_h = share_h · rate`` per tier."""
        return tuple(s * self.rate for s in self.shares)

    @property
    def prefix(self) -> tuple[float, ...]:
        """``P_m = S_0 + … + S_m``; the last one is exactly ``rate``."""
        out: list[float] = []
        acc = 0.0
        for cap in self.capacities[:-1]:
            acc += cap
            out.append(acc)
        return (*out, float(self.rate))

    def capacity(self, tier: Tier) -> float:
        return self.capacities[TIERS.index(Tier(tier))]


@dataclass(frozen=True, slots=True)
class CapacityRules:
    """Provider contracts plus the Redis-down policy, built from :class:`Settings`."""

    providers: Mapping[str, ProviderRule]
    redis_down: Mapping[Tier, RedisDown]
    local_rate_fraction: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> CapacityRules:
        shares = (settings.share(Tier.P0), settings.share(Tier.P1),
                  settings.share(Tier.P2), settings.share(Tier.P3))
        providers = {
            pid: ProviderRule(pid, float(rate), shares, settings.p0_emergency_rate)
            for pid, rate in settings.provider_rates.items()
        }
        return cls(providers, {t: settings.policy(t).redis_down for t in TIERS},
                   settings.local_rate_fraction)

    def provider(self, provider_id: str) -> ProviderRule:
        try:
            return self.providers[provider_id]
        except KeyError:
            raise ValueError(f"no contracted rate for provider {provider_id!r}") from None


@dataclass(frozen=True, slots=True)
class Request:
    """Ask for ``n >= 1`` tokens of ``tier``; the tenant limit applies iff both tenant fields
    are given."""

    tier: Tier
    n: int = 1
    tenant_id: str | None = None
    tenant_rate: float | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be >= 1")
        if self.tenant_rate is not None and not self.tenant_rate > 0:
            raise ValueError("tenant_rate must be > 0")

    @property
    def tenant_limited(self) -> bool:
        return self.tenant_id is not None and self.tenant_rate is not None


@dataclass(frozen=True, slots=True)
class Decision:
    """``granted`` tokens (``emergency`` of them from the P0 emergency quota); when nothing
    was granted, ``wait_us`` > 0 is the time until a token could be available; ``room``: the
    whole tokens the tier may still be granted in the window after this grant (≥ 0)."""

    granted: int
    emergency: int
    wait_us: int
    now_us: int
    room: int = 0

    @property
    def wait(self) -> float:
        return self.wait_us / 1_000_000


# reference model ---------------------------------------------------------------------------


@dataclass(slots=True)
class LogEntry:
    at_us: int
    demand: int
    granted: int


@dataclass(slots=True)
class TenantBucket:
    tokens: float
    at_us: int


def _empty_logs() -> tuple[deque[LogEntry], ...]:
    return tuple(deque() for _ in TIERS)


@dataclass(slots=True)
class ModelState:
    """What the script keeps in Redis for one provider (plus tenant buckets, which are shared
    across providers: pass the same dict to share them)."""

    rule: ProviderRule
    logs: tuple[deque[LogEntry], ...] = field(default_factory=_empty_logs)
    emergency_log: deque[tuple[int, int]] = field(default_factory=deque)
    granted: list[int] = field(default_factory=lambda: [0] * len(TIERS))
    demand: list[int] = field(default_factory=lambda: [0] * len(TIERS))
    emergency: int = 0
    last_us: int | None = None
    tenants: dict[str, TenantBucket] = field(default_factory=dict)


def room(rule: ProviderRule, t: int, granted: list[int], demand: list[int]) -> float:
    """Whole tokens tier ``t`` may still be granted under the reservation rule."""
    caps, prefix = rule.capacities, rule.prefix
    used = 0.0
    for h in range(t):
        used = used + max(granted[h], min(demand[h], caps[h]))
    best = math.inf
    for m in range(t, len(TIERS)):
        used = used + granted[m]
        best = min(best, math.floor(prefix[m] - used))
    return best


def decide(state: ModelState, request: Request, now_us: int) -> Decision:
    """Decide one request at ``now_us`` and update ``state`` (the reference for the Lua)."""
    rule = state.rule
    t = TIERS.index(Tier(request.tier))
    n = request.n
    now = now_us if state.last_us is None else max(now_us, state.last_us)
    window = rule.window_us
    cutoff = now - window
    for h, entries in enumerate(state.logs):
        while entries and entries[0].at_us <= cutoff:
            old = entries.popleft()
            state.demand[h] -= old.demand
            state.granted[h] -= old.granted
    while state.emergency_log and state.emergency_log[0][0] <= cutoff:
        state.emergency -= state.emergency_log.popleft()[1]

    avail = n
    tokens = 0.0
    rate = 0.0
    if request.tenant_limited:
        assert request.tenant_id is not None and request.tenant_rate is not None
        rate = request.tenant_rate
        burst = max(1.0, rate)
        bucket = state.tenants.get(request.tenant_id)
        if bucket is None:
            tokens = burst
        else:
            elapsed = max(0, now - bucket.at_us)
            tokens = min(burst, bucket.tokens + elapsed * rate / 1_000_000)
        avail = max(0, min(n, math.floor(tokens)))

    room_now = room(rule, t, state.granted, state.demand)
    k_reg = int(max(0, min(avail, room_now)))
    k_em = 0
    e_rate = rule.emergency_rate
    if t == 0 and e_rate > 0:
        k_em = max(0, min(avail - k_reg, math.floor(e_rate - state.emergency)))
    k = k_reg + k_em
    if avail > 0:
        state.logs[t].append(LogEntry(now, avail, k_reg))
        state.demand[t] += avail
        state.granted[t] += k_reg
    if k_em > 0:
        state.emergency_log.append((now, k_em))
        state.emergency += k_em
    if request.tenant_limited:
        assert request.tenant_id is not None
        tokens = tokens - k
        state.tenants[request.tenant_id] = TenantBucket(tokens, now)
    state.last_us = now

    wait = 0
    if k == 0:
        provider_wait: float = 0
        if room_now < 1:
            provider_wait = _reservation_wait(state, t, now)
        if t == 0 and e_rate >= 1:
            provider_wait = min(provider_wait, _emergency_wait(state, now))
        tenant_wait = 0
        if request.tenant_limited and tokens < 1:
            tenant_wait = math.ceil((1 - tokens) * 1_000_000 / rate) + 1
        wait = int(max(provider_wait, tenant_wait, 1))
    return Decision(k, k_em, wait, now, int(max(0, room(rule, t, state.granted,
                                                        state.demand))))


def _reservation_wait(state: ModelState, t: int, now: int) -> float:
    """µs until expiring entries give tier ``t`` room for one token (nothing new assumed)."""
    rule = state.rule
    granted, demand = list(state.granted), list(state.demand)
    events = sorted((e.at_us, h, e.demand, e.granted)
                    for h, entries in enumerate(state.logs) for e in entries)
    for at, h, d, g in events:
        demand[h] -= d
        granted[h] -= g
        if room(rule, t, granted, demand) >= 1:
            return at + rule.window_us - now
    return rule.window_us


def _emergency_wait(state: ModelState, now: int) -> float:
    e_rate = state.rule.emergency_rate
    if math.floor(e_rate - state.emergency) >= 1:
        return 0
    left = state.emergency
    for at, k in state.emergency_log:
        left -= k
        if math.floor(e_rate - left) >= 1:
            return at + state.rule.window_us - now
    return state.rule.window_us


# Redis -------------------------------------------------------------------------------------

DECIDE_LUA = """
local W = tonumber(ARGV[4])
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tier = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local ttl = tonumber(ARGV[5])
local E = tonumber(ARGV[6])
local cap, pre = {}, {}
for h = 0, 3 do
  cap[h] = tonumber(ARGV[8 + h])
  pre[h] = tonumber(ARGV[12 + h])
end
local meta = KEYS[6]
local mv = redis.call('HMGET', meta, 'last', 'seq', 'em',
  'g0', 'g1', 'g2', 'g3', 'd0', 'd1', 'd2', 'd3')
if mv[1] and now < tonumber(mv[1]) then now = tonumber(mv[1]) end
local nowstr = string.format('%d', now)
local seq = tonumber(mv[2]) or 0
local em = tonumber(mv[3]) or 0
local g, d = {}, {}
for h = 0, 3 do
  g[h] = tonumber(mv[4 + h]) or 0
  d[h] = tonumber(mv[8 + h]) or 0
end
local cutoff = string.format('%d', now - W)
for h = 0, 3 do
  local old = redis.call('ZRANGEBYSCORE', KEYS[h + 1], '-inf', cutoff)
  if #old > 0 then
    for _, m in ipairs(old) do
      local _, dn, gk = string.match(m, '^(%d+):(%d+):(%d+)$')
      d[h] = d[h] - tonumber(dn)
      g[h] = g[h] - tonumber(gk)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[h + 1], '-inf', cutoff)
  end
end
local oldem = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', cutoff)
if #oldem > 0 then
  for _, m in ipairs(oldem) do em = em - tonumber(string.match(m, ':(%d+)$')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', cutoff)
end

local function room(gg, dd)
  local used = 0
  for h = 0, tier - 1 do used = used + math.max(gg[h], math.min(dd[h], cap[h])) end
  local best = math.huge
  for m = tier, 3 do
    used = used + gg[m]
    best = math.min(best, math.floor(pre[m] - used))
  end
  return best
end

local avail = n
local tokens, trate = 0, 0
local tkey = KEYS[7]
if tkey then
  trate = tonumber(ARGV[7])
  local burst = math.max(1, trate)
  local tv = redis.call('HMGET', tkey, 'tokens', 'ts')
  if tv[1] then
    local el = now - tonumber(tv[2])
    if el < 0 then el = 0 end
    tokens = math.min(burst, tonumber(tv[1]) + el * trate / 1000000)
  else
    tokens = burst
  end
  avail = math.max(0, math.min(n, math.floor(tokens)))
end

local room_now = room(g, d)
local kreg = math.max(0, math.min(avail, room_now))
local kem = 0
if tier == 0 and E > 0 then
  kem = math.max(0, math.min(avail - kreg, math.floor(E - em)))
end
local k = kreg + kem
if avail > 0 then
  seq = seq + 1
  redis.call('ZADD', KEYS[tier + 1], nowstr, string.format('%d:%d:%d', seq, avail, kreg))
  d[tier] = d[tier] + avail
  g[tier] = g[tier] + kreg
end
if kem > 0 then
  seq = seq + 1
  redis.call('ZADD', KEYS[5], nowstr, string.format('%d:%d', seq, kem))
  em = em + kem
end
if tkey then
  tokens = tokens - k
  redis.call('HSET', tkey, 'tokens', string.format('%.17g', tokens), 'ts', nowstr)
  redis.call('PEXPIRE', tkey, ttl + math.ceil(math.max(1, trate) / trate * 1000))
end
redis.call('HSET', meta, 'last', nowstr, 'seq', string.format('%d', seq),
  'em', string.format('%d', em),
  'g0', string.format('%d', g[0]), 'g1', string.format('%d', g[1]),
  'g2', string.format('%d', g[2]), 'g3', string.format('%d', g[3]),
  'd0', string.format('%d', d[0]), 'd1', string.format('%d', d[1]),
  'd2', string.format('%d', d[2]), 'd3', string.format('%d', d[3]))
for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end

local CHUNK = 32
local function cursor(key)
  return {key = key, buf = {}, pos = 1, off = 0, done = false}
end
local function head(c)
  if c.pos > #c.buf then
    if c.done then return nil end
    c.buf = redis.call('ZRANGE', c.key, c.off, c.off + CHUNK - 1, 'WITHSCORES')
    c.off = c.off + CHUNK
    c.pos = 1
    c.done = #c.buf < 2 * CHUNK
    if #c.buf == 0 then return nil end
  end
  return tonumber(c.buf[c.pos + 1])
end

local room_after = math.max(0, room(g, d))
local wait = 0
if k == 0 then
  local pw = 0
  if room_now < 1 then
    pw = W
    local cs = {}
    for h = 0, 3 do cs[h] = cursor(KEYS[h + 1]) end
    while true do
      local best, bh = nil, nil
      for h = 0, 3 do
        local at = head(cs[h])
        if at and (best == nil or at < best) then best, bh = at, h end
      end
      if best == nil then break end
      local c = cs[bh]
      local _, dn, gk = string.match(c.buf[c.pos], '^(%d+):(%d+):(%d+)$')
      c.pos = c.pos + 2
      d[bh] = d[bh] - tonumber(dn)
      g[bh] = g[bh] - tonumber(gk)
      if room(g, d) >= 1 then
        pw = best + W - now
        break
      end
    end
  end
  if tier == 0 and E >= 1 then
    local ew = 0
    if math.floor(E - em) < 1 then
      ew = W
      local left = em
      local c = cursor(KEYS[5])
      while true do
        local at = head(c)
        if at == nil then break end
        left = left - tonumber(string.match(c.buf[c.pos], ':(%d+)$'))
        c.pos = c.pos + 2
        if math.floor(E - left) >= 1 then
          ew = at + W - now
          break
        end
      end
    end
    pw = math.min(pw, ew)
  end
  local tw = 0
  if tkey and tokens < 1 then tw = math.ceil((1 - tokens) * 1000000 / trate) + 1 end
  wait = math.max(pw, tw, 1)
end
return {k, kem, wait, now, room_after}
"""


class CapacityStore:
    """The Lua decision over Redis; one instance per worker event loop."""

    def __init__(self, client: aioredis.Redis, rules: CapacityRules, namespace: str = "",
                 key_ttl_ms: int = 10_000) -> None:
        if any(key_ttl_ms < 2 * r.window_us // 1000 for r in rules.providers.values()):
            raise ValueError("key_ttl_ms must be at least twice the window")
        self.r = client
        self.rules = rules
        self.ns = namespace
        self.key_ttl_ms = key_ttl_ms
        self._script = client.register_script(DECIDE_LUA)

    @classmethod
    def open(cls, settings: Settings, timeout: float = 0.5) -> CapacityStore:
        """A store with its own Redis client: short timeouts and one immediate retry, so an
        unreachable Redis is noticed within about ``2 * timeout``."""
        client = redis_client(settings, timeout=timeout,
                              retry=Retry(NoBackoff(), 1), health_check_interval=30)
        return cls(client, CapacityRules.from_settings(settings), settings.topic_prefix)

    def provider_keys(self, provider_id: str) -> list[str]:
        base = f"{self.ns}cap:{provider_id}"
        return [*(f"{base}:log:{t.value}" for t in TIERS), f"{base}:em", f"{base}:meta"]

    def tenant_key(self, tenant_id: str) -> str:
        return f"{self.ns}cap:tenant:{tenant_id}"

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision:
        """One atomic decision; ``now_us`` overrides Redis's clock (tests only)."""
        rule = self.rules.provider(provider_id)
        keys = self.provider_keys(provider_id)
        tenant_rate = ""
        if request.tenant_id is not None and request.tenant_rate is not None:
            keys.append(self.tenant_key(request.tenant_id))
            tenant_rate = repr(float(request.tenant_rate))
        args: list[str | int] = [
            "" if now_us is None else int(now_us),
            TIERS.index(Tier(request.tier)),
            request.n,
            rule.window_us,
            self.key_ttl_ms,
            repr(float(rule.emergency_rate)),
            tenant_rate,
            *(repr(c) for c in rule.capacities),
            *(repr(p) for p in rule.prefix),
        ]
        k, k_em, wait, now, left = await self._script(keys=keys, args=args)
        return Decision(int(k), int(k_em), int(wait), int(now), int(left))

    async def aclose(self) -> None:
        await self.r.aclose()


class DecisionSource(Protocol):
    """Where a limiter gets its decisions: :class:`CapacityStore`, or :class:`ModelStore`."""

    rules: CapacityRules

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision: ...

    async def aclose(self) -> None: ...


class ModelStore:
    """The reference model behind the store interface: one process only (tests, dev)."""

    def __init__(self, rules: CapacityRules,
                 clock_us: Callable[[], int] = lambda: time.monotonic_ns() // 1000) -> None:
        self.rules = rules
        self.clock_us = clock_us
        self.tenants: dict[str, TenantBucket] = {}
        self.states = {pid: ModelState(rule, tenants=self.tenants)
                       for pid, rule in rules.providers.items()}

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision:
        self.rules.provider(provider_id)
        now = self.clock_us() if now_us is None else now_us
        return decide(self.states[provider_id], request, now)

    async def aclose(self) -> None:
        return None


# worker-side limiter -----------------------------------------------------------------------


@dataclass(slots=True)
class _Lease:
    tokens: int = 0
    used: int = 0
    size: int = 0
    leftover: int = 0
    expires: float = 0.0
    blocked_until: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(slots=True)
class LimiterStats:
    """Counters of one limiter (for metrics and benchmarks)."""

    round_trips: int = 0
    leased: int = 0
    denied: int = 0
    expired_unused: int = 0
    local_grants: int = 0
    paused: int = 0


_LeaseKey = tuple[str, Tier, str | None]


class CapacityLimiter:
    """Per-process limiter: local leases refilled from :class:`CapacityStore`.

    :meth:`acquire` never sleeps: it returns None when a token was taken, else the seconds to
    wait (the caller sleeps on its own loop). Leases start at one token, double while they
    are used up within ``lease_ttl`` and shrink to what was used when they expire; they never
    exceed ``lease_fraction`` of the tier's capacity per second (of the tenant's rate when
    tenant-limited). While Redis is unreachable, ``redis_down`` of the tier decides: ``local``
    takes tokens from a local bucket at ``local_rate_fraction * S_t / expected_workers``,
    ``pause`` returns ``pause_wait``; Redis is probed in the background at most every
    ``probe_interval`` (no caller waits on it).
    """

    def __init__(self, source: Settings | DecisionSource, *, expected_workers: int = 1,
                 lease_ttl: float = 0.25, lease_fraction: float = 0.1,
                 pause_wait: float = 0.5, probe_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 store_timeout: float = 0.5, health: RedisHealth | None = None) -> None:
        """``source``: the settings (the limiter opens its own :class:`CapacityStore`, whose
        Redis calls time out after ``store_timeout`` seconds), or a store. ``health``: the
        process's shared view of Redis (default: one of its own); while it says down,
        take the fallback without asking."""
        if expected_workers < 1 or lease_ttl <= 0 or not 0 < lease_fraction <= 1:
            raise ValueError("bad limiter parameters")
        store = (CapacityStore.open(source, store_timeout) if isinstance(source, Settings)
                 else source)
        self.store: DecisionSource = store
        self.rules = store.rules
        self.expected_workers = expected_workers
        self.lease_ttl = lease_ttl
        self.lease_fraction = lease_fraction
        self.pause_wait = pause_wait
        self.probe_interval = probe_interval
        self.clock = clock
        self.stats = LimiterStats()
        self._leases: dict[_LeaseKey, _Lease] = {}
        self._local: dict[tuple[str, Tier] | tuple[str, str], TokenBucket] = {}
        self._redis_ok = True
        self._next_probe = 0.0
        self._probing = False
        self._probes: set[asyncio.Task[None]] = set()
        self.health = health or RedisHealth(clock=clock)
        self.fill: dict[tuple[str, Tier], tuple[float, float]] = {}
        """(provider, tier) → (room left / provider rate, clock reading) of the last decision."""
        _limiters.add(self)

    @property
    def redis_ok(self) -> bool:
        """False while Redis is unreachable (the flow exposes it as a health signal)."""
        return self._redis_ok

    async def acquire(self, provider_id: str, tier: Tier, tenant_id: str | None = None,
                      tenant_rate: float | None = None) -> float | None:
        """Take one token for a provider call: None when taken, else seconds to wait."""
        rule = self.rules.provider(provider_id)
        tier = Tier(tier)
        limited = tenant_id is not None and tenant_rate is not None
        key: _LeaseKey = (provider_id, tier, tenant_id if limited else None)
        lease = self._leases.get(key)
        if lease is None:
            lease = self._leases[key] = _Lease()
        if self._from_lease(lease):
            return None
        async with lease.lock:
            if self._from_lease(lease):
                return None
            now = self.clock()
            if lease.blocked_until > now:
                return lease.blocked_until - now
            if not self._redis_ok or self.health.down:
                if not self._redis_ok and not self._probing and now >= self._next_probe:
                    self._probe(provider_id, Request(tier, 1, key[2],
                                                     tenant_rate if limited else None))
                return self._fallback(rule, tier, key[2], tenant_rate, now)
            n = self._lease_size(lease, rule, tier, tenant_rate if limited else None)
            request = Request(tier, n, key[2], tenant_rate if limited else None)
            try:
                decision = await self.store.request(provider_id, request)
            except DOWN_ERRORS as exc:
                self._mark_down(exc, now)
                return self._fallback(rule, tier, key[2], tenant_rate, self.clock())
            self._mark_up()
            self.stats.round_trips += 1
            now = self.clock()
            self.fill[(provider_id, tier)] = (min(1.0, decision.room / rule.rate), now)
            if decision.granted == 0:
                self.stats.denied += 1
                _count_denial(provider_id, tier, limited)
                lease.blocked_until = now + decision.wait
                return decision.wait
            self.stats.leased += decision.granted
            lease.size = n
            lease.tokens = decision.granted - 1
            lease.used = 1
            lease.leftover = 0
            lease.expires = now + self.lease_ttl
            return None

    async def take(self, provider_id: str, tier: Tier, tenant_id: str | None = None,
                   tenant_rate: float | None = None) -> None:
        """Wait (asynchronously) until a token is taken."""
        while (wait := await self.acquire(provider_id, tier, tenant_id, tenant_rate)) is not None:
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        for task in list(self._probes):
            task.cancel()
        await self.store.aclose()

    def _probe(self, provider_id: str, request: Request) -> None:
        """Ask Redis again in the background (one probe at a time; its token, if granted,
        is not used): a caller never waits on a Redis that stopped answering, it takes the
        fallback while the probe runs."""
        self._probing = True

        async def probe() -> None:
            try:
                await self.store.request(provider_id, request)
            except DOWN_ERRORS as exc:
                self._mark_down(exc, self.clock())
            else:
                self._mark_up()
            finally:
                self._probing = False

        task = asyncio.get_running_loop().create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def _from_lease(self, lease: _Lease) -> bool:
        if lease.tokens <= 0:
            return False
        if self.clock() >= lease.expires:
            self.stats.expired_unused += lease.tokens
            lease.leftover = lease.tokens
            lease.tokens = 0
            return False
        lease.tokens -= 1
        lease.used += 1
        return True

    def _lease_size(self, lease: _Lease, rule: ProviderRule, tier: Tier,
                    tenant_rate: float | None) -> int:
        per_second = rule.capacity(tier) if tenant_rate is None else tenant_rate
        ceiling = max(1, math.floor(self.lease_fraction * per_second))
        if lease.size == 0:
            size = 1
        elif lease.leftover > 0:
            size = max(1, lease.used)
        else:
            size = lease.size * 2
        return min(ceiling, size)

    def _mark_down(self, exc: BaseException, now: float) -> None:
        if self._redis_ok:
            log.warning("capacity limiter: Redis unreachable (%s); tiers fall back to their "
                        "redis_down policy", exc)
        self._redis_ok = False
        self._next_probe = now + self.probe_interval
        self.health.failed()

    def _mark_up(self) -> None:
        self.health.answered()
        if not self._redis_ok:
            log.warning("capacity limiter: Redis reachable again; cluster limits resume")
            self._redis_ok = True
            self._local.clear()

    def _bucket(self, key: tuple[str, Tier] | tuple[str, str], rate: float,
                now: float) -> TokenBucket:
        bucket = self._local.get(key)
        if bucket is None:
            burst = max(1.0, rate * self.lease_ttl)
            bucket = self._local[key] = TokenBucket.full(rate, burst, now)
        return bucket

    def _fallback(self, rule: ProviderRule, tier: Tier, tenant_id: str | None,
                  tenant_rate: float | None, now: float) -> float | None:
        rate = (self.rules.local_rate_fraction * rule.capacity(tier)) / self.expected_workers
        if self.rules.redis_down.get(tier, "pause") == "pause" or rate <= 0:
            self.stats.paused += 1
            return self.pause_wait
        buckets = [self._bucket((rule.provider_id, tier), rate, now)]
        if tenant_id is not None and tenant_rate is not None:
            buckets.append(self._bucket(("tenant", tenant_id),
                                        tenant_rate / self.expected_workers, now))
        wait = max(b.peek(now) for b in buckets)
        if wait > 0:
            _count_denial(rule.provider_id, tier, len(buckets) > 1)
            return wait
        for b in buckets:
            b.take(now)
        self.stats.local_grants += 1
        return None


def _count_denial(provider_id: str, tier: Tier, tenant_limited: bool) -> None:
    """``notiflow.ratelimit.denials``: one refused capacity request (scope ``tenant`` when the
    request carried a tenant limit: the reply does not say which limit refused it)."""
    _denials.add(1, {"provider": provider_id, "tier": tier.value,
                     "scope": "tenant" if tenant_limited else "provider"})


_limiters: weakref.WeakSet[CapacityLimiter] = weakref.WeakSet()


def observe_fill(options: CallbackOptions | None = None) -> Iterable[Observation]:
    """``notiflow.ratelimit.fill``: the latest cluster answer per provider and tier among this
    process's limiters; a reading older than two windows (the tier went quiet here) is not
    reported rather than reported stale."""
    latest: dict[tuple[str, Tier], tuple[float, float]] = {}
    for limiter in list(_limiters):
        now = limiter.clock()
        for (provider_id, tier), (ratio, at) in list(limiter.fill.items()):
            window = limiter.rules.provider(provider_id).window_us / 1_000_000
            if now - at <= 2 * window and at >= latest.get((provider_id, tier), (0.0, -1.0))[1]:
                latest[(provider_id, tier)] = (ratio, at)
    for (provider_id, tier), (ratio, _at) in latest.items():
        yield Observation(ratio, {"provider": provider_id, "tier": tier.value})


names.RATELIMIT_FILL.create(metrics.get_meter(names.METER), callbacks=[observe_fill])
