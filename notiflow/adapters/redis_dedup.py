"""Send dedup in Redis: per-attempt leases and content fingerprints, pipelined per batch.

Lease ``lease:{message_id}:{attempt}``: ``SET NX`` with a TTL of at least the tier TTL. Its
value says who holds it and how the attempt ended, so a replayed record can be told apart
from a new one:

- ``pending:{owner}:{ms}`` — process ``owner`` holds the attempt; ``ms`` is when it took the
  lease or last confirmed it (just before calling the provider). Another process may take
  a pending lease over only once it is older than the tier's stale bound (its owner died),
  and an owner sends only after confirming it still holds the lease (fencing: two processes
  never both send one attempt, even while an old and a new process overlap);
- ``done:{json}`` — the provider accepted it (or it ended for good); replays are skipped and
  the recorded outcome re-emitted.

Confirming also passes the message's cancel gate in the same script (``cancel_gate.py``).

A lease is deleted when an attempt fails before the provider accepted it, so the next try
(retry, failover, replay) is not mistaken for a duplicate.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import orjson
import redis.asyncio as aioredis

from notiflow.adapters.cancel_gate import (
    CANCELLED,
    CLEAR,
    CONFIRM,
    SENDING,
    campaign_gate_key,
    gate_key,
)
from notiflow.adapters.ports import Confirm, LeaseState
from notiflow.adapters.redis_pool import Coalescer, redis_client
from notiflow.correlation import CorrelationKeys
from notiflow.settings import Settings

_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_RELEASE_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
"""KEYS: a content claim. ARGV: the message id that must hold it (exactly: ``msg_1`` never
releases ``msg_12``'s claim)."""

_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


def _set(pipe: Any, *, key: str, value: str, px: int) -> object:
    return pipe.set(key, value, px=px)


def _clear(pipe: Any, *, gate: str) -> object:
    return pipe.eval(CLEAR, 1, gate, SENDING)


class DedupStore:
    """Leases and content fingerprints; one client per worker event loop."""

    def __init__(self, client: aioredis.Redis, owner: str, namespace: str = "", *,
                 keys: CorrelationKeys) -> None:
        """``keys``: the correlation keys that tell a campaign's messages
        (:meth:`campaign_gate_key`)."""
        self.r = client
        self.owner = owner
        self.ns = namespace
        self.keys = keys
        self.batch = Coalescer(client)

    @classmethod
    def open(cls, settings: Settings, owner: str, timeout: float = 5.0) -> DedupStore:
        """``timeout``: of each command on the socket (a send flow passes its tier's
        ``redis_timeout``: a Redis that stops answering is noticed within P0's SLA)."""
        client = redis_client(settings, timeout=timeout, connect_timeout=min(2.0, timeout),
                              health_check_interval=30)
        return cls(client, owner, settings.topic_prefix,
                   keys=CorrelationKeys.from_settings(settings))

    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"{self.ns}lease:{message_id}:{attempt}"

    def gate_key(self, message_id: str) -> str:
        return gate_key(self.ns, message_id)

    def content_key(self, tenant_id: str, fingerprint: str) -> str:
        return f"{self.ns}content:{tenant_id}:{fingerprint}"

    @property
    def pending_prefix(self) -> str:
        return f"pending:{self.owner}:"

    def pending_value(self) -> str:
        return f"{self.pending_prefix}{int(time.time() * 1000)}"

    async def acquire(self, keys: list[str], ttl: timedelta) -> list[LeaseState]:
        """``SET key pending:{owner}:{now} NX PX ttl GET`` for every key in one round trip."""
        if not keys:
            return []
        pipe = self.r.pipeline(transaction=False)
        px = int(ttl.total_seconds() * 1000)
        for k in keys:
            pipe.set(k, self.pending_value(), nx=True, px=px, get=True)
        previous = await pipe.execute()
        return [LeaseState(True) if prev is None else LeaseState(False, prev)
                for prev in previous]

    async def take_over(self, key: str, stale: str, ttl: timedelta) -> bool:
        """Replace the stale ``pending`` lease of a dead process with ours (atomic: only if
        it still holds exactly ``stale``)."""
        px = int(ttl.total_seconds() * 1000)
        return bool(await self.r.eval(_TAKE_OVER, 1, key, stale, self.pending_value(), px))

    def campaign_gate_key(self, message_id: str) -> str | None:
        return campaign_gate_key(self.ns, message_id, self.keys)

    async def confirm(self, key: str, gate: str, ttl: timedelta,
                      campaign: str | None = None) -> Confirm:
        """Just before calling the provider, with the message's cancel ``gate``: OURS when
        the lease is still ours (its time refreshed, the gate set ``sending`` for ``ttl``);
        LOST when another process took it over (then it sends, we do not); CANCELLED when
        the message or its ``campaign`` (the campaign's gate) was cancelled (nothing is
        sent). Coalesced like :meth:`finish`."""
        px = int(ttl.total_seconds() * 1000)
        prefix, value = self.pending_prefix, self.pending_value()
        keys = (key, gate) if campaign is None else (key, gate, campaign)
        return Confirm(int(await self.batch.call(
            lambda pipe: pipe.eval(CONFIRM, len(keys), *keys, prefix, value, px, CANCELLED,
                                   SENDING))))

    async def finish(self, items: list[tuple[str, dict[str, object]]], ttl: timedelta,
                     clear: Sequence[str] = ()) -> None:
        """Mark leases done with the recorded outcome, and clear the ``sending`` of the
        cancel gates in ``clear`` (attempts that will be tried again), coalesced with the
        other sends' confirmations and outcomes of this moment into one round trip."""
        px = int(ttl.total_seconds() * 1000)
        values = [(key, "done:" + orjson.dumps(outcome).decode()) for key, outcome in items]
        await asyncio.gather(
            *(self.batch.call(functools.partial(_set, key=k, value=v, px=px))
              for k, v in values),
            *(self.batch.call(functools.partial(_clear, gate=g)) for g in clear))

    async def release(self, keys: list[str]) -> None:
        """Drop our own pending leases (an attempt failed before the provider accepted it)."""
        if not keys:
            return
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.eval(_RELEASE, 1, k, self.pending_prefix)
        await pipe.execute()

    async def claim_content(self, items: list[tuple[str, str]],
                            window: timedelta) -> list[str | None]:
        """For each (fingerprint key, message_id): claim it for the window; returns the
        message id that already holds it, or None when the claim is ours (or a replay)."""
        if not items:
            return []
        pipe = self.r.pipeline(transaction=False)
        px = int(window.total_seconds() * 1000)
        for key, mid in items:
            pipe.set(key, mid, nx=True, px=px, get=True)
        previous = await pipe.execute()
        return [None if prev is None or prev == mid else prev
                for prev, (_, mid) in zip(previous, items, strict=True)]

    async def release_content(self, items: list[tuple[str, str]]) -> None:
        if not items:
            return
        pipe = self.r.pipeline(transaction=False)
        for key, mid in items:
            pipe.eval(_RELEASE_CLAIM, 1, key, mid)
        await pipe.execute()

    def crash_key(self, flow: str) -> str:
        return f"{self.ns}crashes:{flow}"

    async def count_crash(self, flow: str, source: str, ttl: timedelta) -> int:
        """Count one crash of ``flow`` blamed on ``source`` (a record's identity); returns
        the count so far."""
        key = self.crash_key(flow)
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, source, 1)
            pipe.expire(key, int(ttl.total_seconds()))
            count, _ = await pipe.execute()
        return int(count)

    async def crashes(self, flow: str) -> dict[str, int]:
        """Every source record of ``flow`` with its crash count."""
        raw = await self.r.hgetall(self.crash_key(flow))
        return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}

    async def aclose(self) -> None:
        await self.r.aclose()
