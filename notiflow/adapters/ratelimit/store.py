"""Where capacity decisions are made: :class:`CapacityStore` runs ``scripts/decide.lua``
atomically in Redis, one instance per worker event loop; :class:`ModelStore` runs the
reference model in process (one process only: tests, dev). Both are a :class:`DecisionSource`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import resources
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from notiflow.adapters.ratelimit.model import (
    TIERS,
    CapacityRules,
    Decision,
    ModelState,
    Request,
    TenantBucket,
    decide,
)
from notiflow.adapters.redis_pool import redis_client
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

DECIDE_LUA = (resources.files("notiflow.adapters.ratelimit") / "scripts"
              / "decide.lua").read_text("utf-8")
"""The script :class:`CapacityStore` runs: :func:`~.model.decide` in Lua (package data)."""


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
