"""One process's in-memory send ports: :class:`MemoryState` (what a test seeds and
inspects) and :func:`memory_ports`, the ``OpenSendPorts`` that opens a port set over it."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import timedelta

from notiflow.adapters.breaker import State
from notiflow.adapters.cancel_gate import gate_key
from notiflow.adapters.memory.boards import BoardTable, MemoryBoards
from notiflow.adapters.memory.caps import MemoryCaps
from notiflow.adapters.memory.clock import Clock, wall
from notiflow.adapters.memory.leases import LeaseTable, MemoryLeases
from notiflow.adapters.memory.limits import Limits
from notiflow.adapters.memory.providers import MemoryProvider, memory_providers
from notiflow.adapters.memory.stores import MemoryMessages, MemoryPreferences
from notiflow.adapters.ports import OpenSendPorts, SendPorts
from notiflow.adapters.providers import provider_kinds, provider_specs
from notiflow.adapters.providers.base import ProviderClient
from notiflow.adapters.redis_health import RedisHealth
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.settings import Settings

CANCEL_HOLD = timedelta(days=1)


class MemoryState:
    """The shared state behind every port set :func:`memory_ports` opens, with the seeding
    and inspection a test needs."""

    def __init__(self, settings: Settings, tier: Tier,
                 providers: Mapping[str, ProviderClient], clock: Clock) -> None:
        self.settings = settings
        self.tier = tier
        self.clock = clock
        self.namespace = settings.topic_prefix
        self.keys = CorrelationKeys.from_settings(settings)
        self.leases = LeaseTable(clock)
        self.caps = MemoryCaps()
        self.messages = MemoryMessages(clock)
        self.preferences = MemoryPreferences(clock)
        self.limits = Limits(settings, clock)
        self.boards = BoardTable(clock)
        self.providers = dict(providers)
        self.owners: list[str] = []
        """The owner of each port set opened, in order."""
        self._opened = itertools.count(1)

    def cancel(self, message_id: str, hold: timedelta = CANCEL_HOLD) -> bool:
        """What the API's cancel does to the message's gate (False: a sender holds it)."""
        return self.leases.cancel(gate_key(self.namespace, message_id), hold)

    def cancel_campaign(self, campaign_id: str, hold: timedelta = CANCEL_HOLD) -> None:
        self.leases.cancel(f"{self.namespace}campaign-gate:{campaign_id}", hold)

    def gate(self, message_id: str) -> str | None:
        """The message's cancel gate: ``cancelled``, ``sending`` or None."""
        with self.leases.lock:
            return self.leases.get(gate_key(self.namespace, message_id))

    def lease(self, message_id: str, attempt: int) -> str | None:
        with self.leases.lock:
            return self.leases.get(f"{self.namespace}lease:{message_id}:{attempt}")

    def open_breaker(self, provider_id: str, lane: str = "") -> State:
        """Open the breaker of ``provider_id`` on ``lane`` ("" priority, ``bulk``). A port
        set that already asked sees it once its cached copy is stale (``cache_ttl`` of
        :class:`~notiflow.adapters.breaker.CircuitBreakers`, on the clock)."""
        return self.limits.breakers[lane].trip(provider_id)

    def put_template(self, tenant_id: str, template_id: str, channel: Channel | str,
                     body: str, subject: str | None = None, version: int = 1,
                     locales: Mapping[str, tuple[str | None, str]] | None = None) -> int:
        return self.messages.put_template(tenant_id, template_id, str(Channel(channel).value),
                                          body, subject, version, locales)

    def put_preference(self, state: PreferenceState) -> None:
        self.preferences.put(state)

    def provider(self, provider_id: str) -> MemoryProvider:
        """The :class:`MemoryProvider` of ``provider_id`` (not one a test gave instead)."""
        client = self.providers[provider_id]
        assert isinstance(client, MemoryProvider), f"{provider_id} is not a MemoryProvider"
        return client

    def accepted_counts(self) -> dict[str, int]:
        """message_id → calls every provider accepted (a duplicate across providers counts)."""
        counts: dict[str, int] = {}
        for p in self.providers.values():
            for c in p.sent() if isinstance(p, MemoryProvider) else ():
                if c.result.outcome.value == "accepted":
                    mid = c.message.message_id
                    counts[mid] = counts.get(mid, 0) + 1
        return counts

    def open(self, workers: int = 1, tier: Tier | None = None) -> SendPorts:
        """A port set of a new owner over this state, for a send flow of ``tier`` (default:
        the state's; it picks the breakers' lane)."""
        owner = f"memory:{next(self._opened)}"
        self.owners.append(owner)
        lane = self.settings.policy(tier or self.tier).lane
        health = RedisHealth(clock=lambda: self.clock().timestamp())
        breakers = self.limits.open_breakers(lane, health)
        quota = self.limits.open_quota(workers, health)

        async def close() -> None:
            await breakers.aclose()
            await quota.aclose()

        return SendPorts(
            leases=MemoryLeases(self.leases, owner, self.namespace, self.keys),
            caps=self.caps, messages=self.messages, preferences=self.preferences,
            breakers=breakers, quota=quota, boards=MemoryBoards(self.boards, owner),
            providers=self.providers, close=close, health=health)

    def opener(self, tier: Tier | None = None, workers: int = 1) -> OpenSendPorts:
        """The ``OpenSendPorts`` of a send flow of ``tier`` over this state."""
        async def open_ports() -> SendPorts:
            return self.open(workers, tier)

        return open_ports


def configured_providers(settings: Settings, clock: Clock = wall) -> dict[str, MemoryProvider]:
    """One :class:`MemoryProvider` per enabled provider account, on its channel."""
    kinds = provider_kinds(settings)
    return memory_providers({pid: provider_specs(type(settings))[kinds[pid]].channel
                             for pid in sorted(settings.enabled_providers())}, clock)


def memory_ports(settings: Settings, tier: Tier, *,
                 providers: Mapping[str, ProviderClient] | None = None, clock: Clock = wall,
                 workers: int = 1) -> tuple[MemoryState, OpenSendPorts]:
    """The state and the ``OpenSendPorts`` of a send flow of ``tier`` on memory ports
    (``providers``: default one accepting :class:`MemoryProvider` per enabled account; any
    ``ProviderClient`` may stand in).
    Every call of the opener gives a port set of a new owner over the same state, as the
    dispatchers of several processes share one Redis and one Cassandra."""
    state = MemoryState(settings, tier, providers if providers is not None
                        else configured_providers(settings, clock), clock)
    return state, state.opener(workers=workers)
