"""The capacity decision as a pure model: rules and requests as value objects, the state the
script keeps per provider, and :func:`decide`, the reference ``scripts/decide.lua`` mirrors
operation for operation. Time comes in as ``now_us``; nothing here reads a clock or touches
Redis. The rule and its guarantees are stated in :mod:`notiflow.adapters.ratelimit`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

TIERS: tuple[Tier, ...] = (Tier.P0, Tier.P1, Tier.P2, Tier.P3)
WINDOW_US = 1_000_000

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
