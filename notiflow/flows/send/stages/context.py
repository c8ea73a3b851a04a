"""What every stage of the send step shares: settings, the ports, and the rules for calling
them (Redis down → wait or fall back by tier; Cassandra down → wait, then stop the flow)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.outages import OUTAGE, REDIS_DOWN, REDIS_UNREACHABLE
from notiflow.adapters.ports import Health, SendPorts
from notiflow.adapters.pressure import LatencyWindow
from notiflow.adapters.redis_health import HOLD_S, RedisGuard, RedisHealth
from notiflow.adapters.retrying import until_up
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import Clock, dead_letter, scaled_lease_ttl, status_event
from notiflow.flows.send.cap_rules import LocalCaps
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord, StatusEvent
from notiflow.settings import Settings, TierPolicy
from notiflow.unsubscribe import UnsubscribeKeys

log = logging.getLogger("notiflow.flows.dispatch")
T = TypeVar("T")

INFRA_RETRY_FOR = timedelta(seconds=60)
REDIS_PAUSE_S = 0.5
REDIS_RECHECK = timedelta(seconds=HOLD_S)
"""After a failed Redis call (:class:`RedisHealth` down), a tier on ``local`` takes its
fallback without asking for this long, and then lets one dedup call at a time ask again: a
Redis that stops answering costs one call a second its ``redis_timeout``, not every call."""
STALE_MARGIN = timedelta(seconds=2)


class InfraUnavailable(RuntimeError):
    """Kafka, Cassandra or Redis stayed unavailable: the flow stops, no record is to blame."""


@dataclass
class SendContext:
    """One dispatcher's shared state. ``source`` names the flow in events and crash counts;
    ``ports`` are attached once opened (:meth:`attach`)."""

    settings: Settings
    tier: Tier
    policy: TierPolicy
    cipher: DlqCipher
    clock: Clock
    rng: random.Random
    source: str
    workers: int = 1
    crashes: dict[str, int] = field(default_factory=dict)
    p0_latencies: LatencyWindow = field(default_factory=LatencyWindow)
    local_caps: LocalCaps = field(init=False)
    own_health: RedisHealth = field(init=False)
    redis_guard: RedisGuard = field(init=False)
    """The dedup calls' rule over :attr:`redis_health`: off Redis after it did not answer,
    back by one probing call at a time once the health's hold is over."""
    webhook_prefixes: dict[str, tuple[str, ...]] = field(init=False)
    unsubscribe_keys: UnsubscribeKeys | None = field(init=False)
    """The keys of the one-click unsubscribe links; None without ``unsubscribe.base_url``."""
    _ports: SendPorts | None = None

    def __post_init__(self) -> None:
        self.webhook_prefixes = self.settings.webhook_prefixes()
        self.unsubscribe_keys = (
            UnsubscribeKeys.of(CorrelationKeys.from_settings(self.settings))
            if self.settings.unsubscribe.base_url is not None else None)
        self.local_caps = LocalCaps(share=self.workers)
        self.own_health = RedisHealth(REDIS_RECHECK.total_seconds(),
                                      clock=lambda: self.clock().timestamp())
        self.redis_guard = RedisGuard(self.own_health)

    @property
    def redis_health(self) -> Health:
        """The ports' shared view of Redis (``adapters/redis_health.py``), else this
        context's own (ports without one)."""
        ports = self._ports
        return ports.health if ports is not None and ports.health is not None \
            else self.own_health

    def attach(self, ports: SendPorts) -> None:
        self._ports = ports
        self.redis_guard.health = self.redis_health

    @property
    def redis_ok(self) -> bool:
        """Redis answered the last dedup call (the flow's health signal)."""
        return self.redis_guard.ok

    @property
    def opened(self) -> SendPorts | None:
        """The ports once attached, else None (for loops that run before they open)."""
        return self._ports

    @property
    def ports(self) -> SendPorts:
        if self._ports is None:
            raise RuntimeError("the send step's ports are not open")
        return self._ports

    @property
    def content_window(self) -> timedelta:
        return self.settings.scaled(self.settings.content_dedup_window)

    async def redis(self, fn: Callable[[], Awaitable[T]], fallback: T) -> T:
        """A dedup call; any Redis failure takes the tier's ``redis_down`` rule. Tiers on
        ``local`` continue without cluster dedup (``fallback``): without asking while
        :attr:`redis_guard` is off Redis or the health is down, and once the hold is over the
        call that finds the guard free probes (:class:`RedisGuard`, no probe interval of its
        own: the health's hold spaces the probes). Tiers on ``pause`` keep asking every
        ``REDIS_PAUSE_S`` until Redis answers, whatever the health says: the answer is what
        they wait for."""
        local = self.policy.redis_down == "local"
        guard = self.redis_guard
        while True:
            probing = False
            if local and not guard.asks:
                if guard.health.down or not guard.may_probe():
                    return fallback
                probing = True
            try:
                result = await fn()
            except REDIS_DOWN as exc:
                if guard.failed(exc):
                    log.warning("redis unavailable (%s): %s", exc,
                                "sending without cluster dedup" if local else "pausing sends")
                elif not isinstance(exc, REDIS_UNREACHABLE):
                    log.error("redis answered a dedup call with an error (%r): %s", exc,
                              "sending without cluster dedup" if local else "pausing sends")
                if local:
                    return fallback
                await asyncio.sleep(REDIS_PAUSE_S)
                continue
            finally:
                if probing:
                    guard.probe_done()
            if guard.answered():
                log.warning("redis is back")
            return result

    async def infra(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry a store call while the store is down; the message waits meanwhile (its
        source pauses once the channel's bound is reached). Gives up after
        ``INFRA_RETRY_FOR``: :class:`InfraUnavailable` stops the flow."""
        try:
            return await until_up(what, fn, log, first=0.2, most=5.0,
                                  give_up_after=INFRA_RETRY_FOR)
        except OUTAGE as exc:
            raise InfraUnavailable(f"{what} unavailable for {INFRA_RETRY_FOR}") from exc

    def lease_key(self, w: Work) -> str:
        return self.ports.leases.lease_key(w.message_id, w.record.attempt)

    def gate_key(self, w: Work) -> str:
        """The message's cancel gate (``adapters/cancel_gate.py``)."""
        return self.ports.leases.gate_key(w.message_id)

    def lease_ttl(self, w: Work) -> timedelta:
        return scaled_lease_ttl(self.settings, w.record.tier)

    def stale_after(self, w: Work) -> timedelta:
        """How long another process's pending lease is respected: the tier's provider
        timeout twice over plus a margin (an owner confirms its lease just before calling)."""
        return self.settings.policy(w.record.tier).provider_timeout * 2 + STALE_MARGIN

    def event(self, w: Work, status: Status, at: datetime, *, reason: str | None = None,
              attempt: int | None = None, detail: AttemptRecord | None = None,
              next_attempt_at: datetime | None = None) -> StatusEvent:
        """A status event of ``w`` from this flow."""
        return status_event(w, status, at, self.source, reason=reason, attempt=attempt,
                            detail=detail, next_attempt_at=next_attempt_at)

    def dead_letter(self, w: Work, reason: str, error_class: str, category: str,
                    now: datetime, attempts: Iterable[AttemptRecord] = ()) -> DlqRecord:
        """The DLQ record of ``w`` (its original bytes, encrypted), with a ``channel``
        header (who a dead letter is charged to may depend on it, ``flows/common/guard.py``)."""
        channel = ("channel", w.record.channel.value.encode())
        return dead_letter(raw=w.raw, source=w.source, reason=reason, error_class=error_class,
                           category=category, tier=w.record.tier, cipher=self.cipher, now=now,
                           message_id=w.message_id, tenant_id=w.record.tenant_id,
                           headers=(*w.headers, channel), attempts=tuple(attempts))
