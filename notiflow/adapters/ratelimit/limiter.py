"""The worker-side facade: :class:`CapacityLimiter` spends local leases refilled from a
:class:`~notiflow.adapters.ratelimit.store.DecisionSource` and, while Redis is unreachable,
follows each tier's ``redis_down`` policy (local token buckets or a pause). The process's
``notiflow.ratelimit.denials`` and ``notiflow.ratelimit.fill`` instruments live here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from notiflow import names
from notiflow.adapters.outages import REDIS_UNREACHABLE
from notiflow.adapters.ratelimit.model import ProviderRule, Request
from notiflow.adapters.ratelimit.store import CapacityStore, DecisionSource
from notiflow.adapters.redis_health import RedisGuard, RedisHealth
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from notiflow.token_bucket import TokenBucket

log = logging.getLogger("notiflow.adapters.ratelimit")
_denials = names.RATELIMIT_DENIALS.create(metrics.get_meter(names.METER))


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
        self._probes: set[asyncio.Task[None]] = set()
        self.health = health or RedisHealth(clock=clock)
        self.guard = RedisGuard(self.health, probe_interval, clock)
        self.fill: dict[tuple[str, Tier], tuple[float, float]] = {}
        """(provider, tier) → (room left / provider rate, clock reading) of the last decision."""
        _limiters.add(self)

    @property
    def redis_ok(self) -> bool:
        """False while Redis is unreachable (the flow exposes it as a health signal)."""
        return self.guard.ok

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
            if not self.guard.asks:
                if self.guard.may_probe():
                    self._probe(provider_id, Request(tier, 1, key[2],
                                                     tenant_rate if limited else None))
                return self._fallback(rule, tier, key[2], tenant_rate, now)
            n = self._lease_size(lease, rule, tier, tenant_rate if limited else None)
            request = Request(tier, n, key[2], tenant_rate if limited else None)
            try:
                decision = await self.store.request(provider_id, request)
            except REDIS_UNREACHABLE as exc:
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
        async def probe() -> None:
            try:
                await self.store.request(provider_id, request)
            except REDIS_UNREACHABLE as exc:
                self._mark_down(exc, self.clock())
            else:
                self._mark_up()
            finally:
                self.guard.probe_done()

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
        if self.guard.failed(exc, now):
            log.warning("capacity limiter: Redis unreachable (%s); tiers fall back to their "
                        "redis_down policy", exc)

    def _mark_up(self) -> None:
        if self.guard.answered():
            log.warning("capacity limiter: Redis reachable again; cluster limits resume")
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
