"""Idempotency fences in Redis: which request owns a tenant's ``Idempotency-Key`` while its
acceptance is being written.

A fence is ``{prefix}fence:{{tenant}}:{key}`` holding ``{request_hash}:{message_id}``, taken
with ``SET NX GET PX`` (one command: the caller learns at once whether it owns the key, and
if not, which request does) and expiring after ``ttl``. It arbitrates requests that arrive
*together*; the ``idempotency`` row in Cassandra, written plainly once the fence is owned,
answers every later one, so a fence only has to outlive the gap between its ``SET`` and that
row's write (seconds at worst), not the key's 24-hour retention. The tenant is the key's
hash tag, so a Redis Cluster keeps a tenant's fences in one slot (the release script touches
one key).

Calls go through the :class:`~notiflow.adapters.redis_pool.Coalescer` (the claims of one
event-loop turn, e.g. a batch's items, share one pipeline), are bounded by ``timeout_s``,
and after a failure Redis is not asked again for ``down_backoff_s`` (or as long as the
``health`` shared with the process's admission store says so): calls raise
:class:`FenceUnavailable` at once and the caller reserves the key with a Cassandra
lightweight transaction instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from notiflow.adapters.redis_health import RedisHealth, RedisUnreachable
from notiflow.adapters.redis_pool import Coalescer

log = logging.getLogger("notiflow.adapters.idempotency_fence")

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def release_model(store: MutableMapping[str, str], key: str, value: str) -> int:
    """Python reference model of :data:`RELEASE`: delete ``key`` only while it holds
    ``value``; 1 if deleted."""
    if store.get(key) == value:
        del store[key]
        return 1
    return 0


class FenceUnavailable(RuntimeError):
    """Redis did not answer (or failed recently): no fence could be taken."""


@dataclass(frozen=True, slots=True)
class Holder:
    """The request holding a fence."""

    request_hash: str
    message_id: str

    @property
    def value(self) -> str:
        return f"{self.request_hash}:{self.message_id}"

    @classmethod
    def parse(cls, value: str) -> Holder:
        request_hash, _, message_id = value.partition(":")
        return cls(request_hash, message_id)


class Fence:
    """Fences of one API process."""

    def __init__(self, client: aioredis.Redis, prefix: str, ttl: timedelta, *,
                 timeout_s: float, down_backoff_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 health: RedisHealth | None = None) -> None:
        self.r = client
        self.prefix = prefix
        self.ttl_ms = max(1, int(ttl.total_seconds() * 1000))
        self.timeout_s = timeout_s
        self.clock = clock
        self.health = health or RedisHealth(down_backoff_s, clock)
        self._batch = Coalescer(client)
        self._release = client.register_script(RELEASE)

    def key(self, tenant_id: str, key: str) -> str:
        return f"{self.prefix}fence:{{{tenant_id}}}:{key}"

    async def _call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await self.health.ask(fn, self.timeout_s)
        except RedisUnreachable as exc:
            if exc.fresh:
                log.warning("fences unavailable for %.1f s (%r); keys are reserved by "
                            "transaction meanwhile", self.health.hold_s, exc.__cause__)
            raise FenceUnavailable(str(exc)) from exc

    async def claim(self, tenant_id: str, key: str, holder: Holder) -> Holder | None:
        """Take the fence of ``(tenant_id, key)`` for ``holder``: None when taken (or
        ``holder`` had it already: a claim resent after its reply was lost), else the holder
        that has it (and the fence is left as it was)."""
        name = self.key(tenant_id, key)
        previous = await self._call(lambda: self._batch.call(
            lambda pipe: pipe.set(name, holder.value, nx=True, px=self.ttl_ms, get=True)))
        if previous is None or str(previous) == holder.value:
            return None
        return Holder.parse(str(previous))

    async def release(self, tenant_id: str, key: str, holder: Holder) -> bool:
        """Drop the fence if ``holder`` still has it (compare and delete); True if dropped."""
        name = self.key(tenant_id, key)
        return bool(await self._call(
            lambda: self._release(keys=[name], args=[holder.value])))
