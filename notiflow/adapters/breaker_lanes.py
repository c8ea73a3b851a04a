"""Circuit breakers by lane: bulk evidence never opens the breakers priority traffic routes by.

A provider account has one breaker per lane (``TierPolicy.lane``). The priority lane (P0, P1)
keeps ``{ns}cb:{provider}`` and counts only priority outcomes. The bulk lane (P2, P3) records
into ``{ns}cb:{provider}@bulk`` and also stays away from a provider whose priority breaker is
OPEN (priority traffic saw an outage; bulk piling on would only delay the recovery). Why: a
bulk flow runs at a lower CPU priority with deep queues, so its slow calls and timeouts
measure its own starvation as much as the provider. In ``notiflow bench isolation`` the P3
flow opened the shared Twilio breaker on latency, the P0 OTPs went to Vonage, the P3 flow's
timeouts opened Vonage too, and P0 waited 55 s for a probe
(docs/decisions/2026-12-01-p0-reservation-at-shared-bottlenecks.md).
Borrowing goes downward only: a priority outage stops bulk, a bulk-lane opening stops only bulk.
"""

from __future__ import annotations

from collections.abc import Callable

from notiflow.adapters.breaker import Admission, State, StateChange
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.redis_health import RedisHealth
from notiflow.settings import Settings

BULK = "bulk"
PRIORITY = "priority"


class BulkBreakers:
    """The breakers a bulk-lane process uses: its own lane's, gated by the priority lane's
    OPEN state (read, never recorded into). Same interface as :class:`CircuitBreakers`
    where the dispatcher uses it."""

    def __init__(self, own: CircuitBreakers, priority: CircuitBreakers) -> None:
        self.own = own
        self.priority = priority

    @classmethod
    def open(cls, settings: Settings, store_timeout: float = 0.5,
             health: RedisHealth | None = None) -> BulkBreakers:
        """Both lanes' breakers, read by a bulk process whose Redis calls time out after
        ``store_timeout`` seconds."""
        return cls(CircuitBreakers(settings, lane=BULK, store_timeout=store_timeout,
                                   health=health),
                   CircuitBreakers(settings, store_timeout=store_timeout, health=health))

    @property
    def redis_ok(self) -> bool:
        return self.own.redis_ok

    async def allow(self, provider_id: str) -> Admission:
        """REFUSED while the priority breaker is OPEN, else the bulk breaker's answer."""
        above = await self.priority.peek(provider_id)
        if not above.admitted:
            return above
        return await self.own.allow(provider_id)

    async def record(self, provider_id: str, outcome: Outcome, reason: str | None,
                     latency_s: float, probe: bool = False, *,
                     episode: int | None = None) -> State:
        return await self.own.record(provider_id, outcome, reason, latency_s, probe,
                                     episode=episode)

    def state(self, provider_id: str) -> State:
        """The bulk lane's state, OPEN while the priority lane's is."""
        if self.priority.state(provider_id) is State.OPEN:
            return State.OPEN
        return self.own.state(provider_id)

    def weight(self, provider_id: str) -> float:
        return min(self.own.weight(provider_id), self.priority.weight(provider_id))

    def on_change(self, listener: Callable[[StateChange], None]) -> Callable[[], None]:
        """Transitions this process made in either lane (a peek may materialise the
        priority lane's OPEN → HALF_OPEN)."""
        undo = [self.own.on_change(listener), self.priority.on_change(listener)]
        def off() -> None:
            for u in undo:
                u()

        return off

    async def aclose(self) -> None:
        await self.own.aclose()
        await self.priority.aclose()


def lane_breakers(settings: Settings, lane: str, store_timeout: float = 0.5,
                  health: RedisHealth | None = None) -> CircuitBreakers | BulkBreakers:
    """The breakers of a process whose tier is on ``lane`` (Redis calls time out after
    ``store_timeout`` seconds, the tier's ``redis_timeout``; ``health``: the process's shared
    view of Redis)."""
    return (BulkBreakers.open(settings, store_timeout, health) if lane == BULK
            else CircuitBreakers(settings, store_timeout=store_timeout, health=health))
