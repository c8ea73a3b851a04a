"""The send flow's ports, opened: Cassandra, Redis (leases, caps, breakers, boards),
the capacity limiter, the preference store and one client per provider account (behind a
:class:`~notiflow.adapters.providers.batching.Coalescer` where the tier batches and the
provider takes batches).

:func:`opener` binds the settings; the flow's dispatcher calls the result on its own event
loop when the flow runs, never when it is built.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from notiflow.adapters import backlog, pressure
from notiflow.adapters.breaker_lanes import lane_breakers
from notiflow.adapters.cassandra_store import CassandraStore, connect
from notiflow.adapters.kafka_io import AsyncProducer
from notiflow.adapters.ports import OpenSendPorts, SendPorts
from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.providers import open_providers
from notiflow.adapters.providers.batching import coalesced
from notiflow.adapters.ratelimit import CapacityLimiter
from notiflow.adapters.redis_caps import CapStore
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings


@dataclass(frozen=True, slots=True)
class RedisBoards:
    """:class:`~notiflow.adapters.ports.Boards` on the dedup store's Redis client."""

    client: aioredis.Redis
    prefix: str
    reporter: str

    async def report_backlog(self, tier: Tier, oldest: float | None) -> None:
        await backlog.report(self.client, self.prefix, tier, self.reporter, oldest)

    async def report_p0_worst(self, worst_s: float) -> None:
        await pressure.report(self.client, self.prefix, self.reporter, worst_s)

    async def p0_worst(self) -> float | None:
        return await pressure.worst(self.client, self.prefix)


def sender_identity() -> str:
    """``host:pid:random``: who holds a send lease (unique per dispatcher)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def open_send_ports(settings: Settings, tier: Tier, owner: str,
                          workers: int = 1) -> SendPorts:
    """Open every port of a send flow of ``tier`` whose leases ``owner`` holds; ``workers``
    processes share the tier (sizes the limiter's local leases)."""
    policy = settings.policy(tier)
    redis_timeout = policy.redis_timeout.total_seconds()
    cluster, session = await asyncio.to_thread(connect, settings)
    store = CassandraStore(session, settings)
    breakers = lane_breakers(settings, policy.lane, redis_timeout)
    dedup = DedupStore.open(settings, owner)
    limiter = CapacityLimiter(settings, expected_workers=workers, store_timeout=redis_timeout)
    producer = AsyncProducer(settings)
    preferences = PreferenceStore(store, producer)
    providers = coalesced(
        await open_providers(settings, sorted(settings.enabled_providers()),
                             timeout=policy.provider_timeout.total_seconds()),
        policy.provider_batch, policy.provider_batch_linger)

    async def close() -> None:
        for p in providers.values():
            await p.aclose()
        await breakers.aclose()
        await dedup.aclose()
        await limiter.aclose()
        producer.close()
        cluster.shutdown()

    return SendPorts(
        leases=dedup, caps=CapStore(dedup.r, dedup.ns), messages=store,
        preferences=preferences, breakers=breakers, quota=limiter,
        boards=RedisBoards(dedup.r, settings.topic_prefix, owner), providers=providers,
        close=close)


def opener(settings: Settings, tier: Tier, owner: str, workers: int = 1) -> OpenSendPorts:
    """:func:`open_send_ports` bound to its arguments (nothing is opened yet)."""
    return functools.partial(open_send_ports, settings, tier, owner, workers)
