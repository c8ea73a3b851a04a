"""The send flow's ports, opened: Cassandra, Redis (leases, caps, breakers, boards),
the capacity limiter, the preference store and one client per provider account (behind a
:class:`~notiflow.adapters.providers.batching.Coalescer` where the tier batches and the
provider takes batches).

:func:`opener` binds the settings; the flow's dispatcher calls the result on its own event
loop when the flow runs, never when it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from notiflow.adapters import backlog, pressure
from notiflow.adapters.breaker_lanes import lane_breakers
from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.kafka_io import AsyncProducer
from notiflow.adapters.ports import OpenSendPorts, SendPorts
from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.providers import open_provider, open_providers, provider_kinds
from notiflow.adapters.providers.base import ProviderClient
from notiflow.adapters.providers.batching import coalesced
from notiflow.adapters.providers.swappable import Swappable
from notiflow.adapters.ratelimit import CapacityLimiter
from notiflow.adapters.redis_caps import CapStore
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.adapters.redis_health import RedisHealth
from notiflow.adapters.secret_watch import watcher
from notiflow.adapters.webhook_pace import WebhookPace
from notiflow.schemas.enums import Tier
from notiflow.secrets import Keyring, Reload
from notiflow.settings import Settings

log = logging.getLogger("notiflow.send")


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
    health = RedisHealth()
    breakers = lane_breakers(settings, policy.lane, redis_timeout, health)
    dedup = DedupStore.open(settings, owner, redis_timeout)
    limiter = CapacityLimiter(settings, expected_workers=workers, store_timeout=redis_timeout,
                              health=health)
    producer = AsyncProducer(settings)
    pace = WebhookPace.open(settings, redis_timeout)
    preferences = PreferenceStore(store.recipients, producer, settings.preferences_topic)
    timeout = policy.provider_timeout.total_seconds()
    providers = {pid: Swappable(client, drain_s=2 * timeout + 5) for pid, client in coalesced(
        await open_providers(settings, sorted(settings.enabled_providers()), timeout=timeout),
        policy.provider_batch, policy.provider_batch_linger).items()}

    async def reopen(change: Reload) -> None:
        await reopen_providers(keyring.settings, change, providers, tier)

    keyring = Keyring(settings)
    watch = watcher(keyring, reopen)
    watching = asyncio.get_running_loop().create_task(watch.run()) if watch else None

    async def close() -> None:
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        for p in providers.values():
            await p.aclose()
        await breakers.aclose()
        await dedup.aclose()
        await limiter.aclose()
        await pace.aclose()
        producer.close()
        cluster.shutdown()

    return SendPorts(
        leases=dedup, caps=CapStore(dedup.r, dedup.ns), messages=store,
        preferences=preferences, breakers=breakers, quota=limiter,
        boards=RedisBoards(dedup.r, settings.topic_prefix, owner), providers=providers,
        close=close, health=health, pace=pace)


async def reopen_providers(settings: Settings, change: Reload,
                           providers: dict[str, Swappable], tier: Tier) -> None:
    """Replace the client of every provider account whose section ``change`` applied with
    one opened from ``settings``; an account that no longer opens keeps its client (logged).
    An account enabled or renamed by the change waits for a restart (the router's candidates
    are fixed at start)."""
    policy = settings.policy(tier)
    kinds = provider_kinds(settings)
    for provider_id, slot in providers.items():
        kind = kinds.get(provider_id)
        if kind not in change.applied:
            continue
        try:
            client: ProviderClient = await open_provider(
                settings, provider_id, timeout=policy.provider_timeout)
        except (ValueError, OSError) as exc:
            log.error("%s: the reloaded credentials do not open (%s); keeping the previous "
                      "ones", provider_id, exc)
            continue
        slot.swap(coalesced({provider_id: client}, policy.provider_batch,
                            policy.provider_batch_linger)[provider_id])
        log.info("%s: provider client reopened with the reloaded credentials", provider_id)


def opener(settings: Settings, tier: Tier, owner: str, workers: int = 1) -> OpenSendPorts:
    """:func:`open_send_ports` bound to its arguments (nothing is opened yet)."""
    return functools.partial(open_send_ports, settings, tier, owner, workers)
