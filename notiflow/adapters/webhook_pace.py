"""Per-webhook pace of the chat providers: a generic cell rate algorithm (GCRA) that hands out
slots, in one Lua call on Redis's clock.

Every post to one webhook URL asks :meth:`WebhookPace.reserve` for a slot. With emission
interval ``T = 1 / rate`` and tolerance ``tau = (burst - 1) * T``, the theoretical arrival time
``tat`` (stored per webhook) gives the earliest allowed time ``tat - tau`` of the next post:

- ``tat' = max(tat, now)``; the slot is ``max(now, tat' - tau)``; ``tat`` becomes ``tat' + T``.
- A slot at most ``horizon`` ahead is taken (reserved, even when later than now): a message
  paced into the future holds its place, so posts to a busy webhook go out once each, in
  order, ``T`` apart after the burst. A slot further ahead is not taken (the caller retries
  after ``wait``, and nothing is reserved for it).

Guarantee: in any interval of length ``L``, at most ``burst + floor(L / T)`` slots lie (taken
slots are spaced as GCRA spaces conforming cells). :func:`decide` is the reference model in
Python; the Lua script mirrors it on integers (microseconds), so both decide identically.

Key: ``{ns}pace:{provider}:{tenant}:{sha256(url)[:32]}`` (a URL is a credential and never a
key), a string holding ``tat`` in µs, expiring once it no longer matters. The tenant is part
of the key: a tenant posting to another tenant's URL takes none of its slots (the URL's own
limit then answers ``429``, which each message waits out).
"""

from __future__ import annotations

import hashlib
import math
from typing import Final

import redis.asyncio as aioredis

from notiflow.adapters.ports import Slot
from notiflow.adapters.redis_pool import LUA_NOW_US, redis_client
from notiflow.settings import PaceRule, Settings

HORIZON_S: Final = 3600.0
"""The furthest ahead a slot is reserved."""


def interval_us(rule: PaceRule) -> int:
    """The emission interval ``T`` of ``rule`` in µs (at least 1)."""
    return max(1, math.ceil(1e6 / rule.rate))


def decide(tat_us: int | None, now_us: int, rule: PaceRule,
           horizon_us: int = int(HORIZON_S * 1e6)) -> tuple[int | None, Slot]:
    """Reference model: (the new ``tat``, or None to leave it; the slot) for a post at
    ``now_us`` when the stored ``tat`` is ``tat_us`` (None: never posted)."""
    t = interval_us(rule)
    tau = (rule.burst - 1) * t
    tat = max(tat_us or 0, now_us)
    allowed = max(now_us, tat - tau)
    wait = allowed - now_us
    if wait > horizon_us:
        return None, Slot(wait, False)
    return tat + t, Slot(wait, True)


RESERVE_LUA: Final = LUA_NOW_US + """
local t = tonumber(ARGV[2])
local tau = (tonumber(ARGV[3]) - 1) * t
local horizon = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allowed = tat - tau
if allowed < now then allowed = now end
local wait = allowed - now
if wait > horizon then
  return {wait, 0}
end
local new = tat + t
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.floor((new - now) / 1000) + 1000)
return {wait, 1}
"""


def webhook_key(namespace: str, provider_id: str, webhook: str, tenant_id: str) -> str:
    """The Redis key of ``tenant_id``'s slots at ``webhook`` (hashed: the URL is a
    credential)."""
    digest = hashlib.sha256(webhook.encode()).hexdigest()[:32]
    return f"{namespace}pace:{provider_id}:{tenant_id}:{digest}"


class WebhookPace:
    """The Lua GCRA on Redis; one instance per event loop."""

    def __init__(self, client: aioredis.Redis, namespace: str = "",
                 horizon_s: float = HORIZON_S) -> None:
        self.r = client
        self.ns = namespace
        self.horizon_us = int(horizon_s * 1e6)
        self._script = client.register_script(RESERVE_LUA)

    @classmethod
    def open(cls, settings: Settings, timeout: float = 0.5) -> WebhookPace:
        return cls(redis_client(settings, timeout=timeout), settings.topic_prefix)

    async def reserve(self, provider_id: str, webhook: str, rule: PaceRule, *,
                      tenant_id: str, now_us: int | None = None) -> Slot:
        """The slot of one post of ``tenant_id`` to ``webhook``; ``now_us`` overrides Redis's
        clock (tests)."""
        wait, reserved = await self._script(
            keys=[webhook_key(self.ns, provider_id, webhook, tenant_id)],
            args=["" if now_us is None else int(now_us), interval_us(rule), rule.burst,
                  self.horizon_us])
        return Slot(int(wait), bool(int(reserved)))

    async def aclose(self) -> None:
        await self.r.aclose()

