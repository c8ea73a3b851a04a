"""Admission control of ``POST /v1/messages``: shed what the platform cannot promise.

Checked after validation and tenant policy, before the idempotency key is reserved (a replay
of a key reserved earlier is answered from its record and never refused, see
``messages.py``). In order:

1. **backlog** — the tier has a ``max_backlog_age`` (P2, P3 by default) and its oldest unsent
   message is older than that bound (scaled by ``time_scale``): ``429 backlog``.
2. **priority_pressure** — a bulk-lane tier (P2, P3) while P0's worst latency, as the P0
   send flow reports it (``adapters/pressure.py``), is above ``bulk_yield.high`` of P0's SLA:
   ``429 priority_pressure`` with ``Retry-After: 1`` (bulk acceptance yields to P0).
3. **tenant_rate** — the tenant has a ``rate_limit``: one token bucket per tenant (burst of one
   second's worth) shared by every API process: ``429 tenant_rate``.
4. **p0_capacity** — P0 only: a bucket per channel at ``Σ_p share(P0) * provider_rates[p]
   + p0_emergency_rate`` msgs/s, summed over every enabled provider account with a route on
   the channel (``settings.routes``, ``settings.enabled_providers()``), since the send flow
   moves P0 to whichever of them has a token (``flows/send/routing.py`` ``reserve``); accounts
   without a rate add nothing, and there is no envelope when none has one:
   ``429 p0_capacity``.

Buckets 3 and 4 are taken together: a refused request spends no token. Redis unavailable:
P0/P1 are admitted (fail open, logged at most once a minute; the send flows keep their own
limits), P2/P3 get ``503 admission_unavailable`` (fail closed; their flows pause without
Redis anyway).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from notiflow.adapters.admission import (
    AdmissionStore,
    AdmissionUnavailable,
    Bucket,
    one_second_bucket,
)
from notiflow.gateway.errors import rate_limited, unavailable
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import SendRequest
from notiflow.settings import Settings, TenantConfig

log = logging.getLogger("notiflow.gateway.admission")

SHED_RETRY_AFTER = timedelta(seconds=30)
"""``Retry-After`` of a backlog 429 (scaled by ``time_scale``, at least 1 s)."""
FAIL_OPEN_TIERS = frozenset({Tier.P0, Tier.P1})
PRIORITY_RETRY_AFTER_S = 1.0
"""``Retry-After`` of a ``priority_pressure`` 429: P0's signal is re-read every 250 ms."""
LOG_EVERY_S = 60.0


def channel_providers(settings: Settings, channel: Channel) -> frozenset[str]:
    """The enabled provider accounts with a configured route on ``channel``."""
    enabled = settings.enabled_providers()
    return frozenset(r.provider_id for r in settings.routes
                     if r.channel is channel and r.provider_id in enabled)


def p0_rate(settings: Settings, channel: Channel) -> float | None:
    """P0 capacity envelope of a channel in msgs/s; None when none of its providers has a
    rate."""
    rates = [rate for p in channel_providers(settings, channel)
             if (rate := settings.provider_rates.get(p)) and rate > 0]
    if not rates:
        return None
    envelope = settings.share(Tier.P0) * sum(rates) + settings.p0_emergency_rate
    return envelope if envelope > 0 else None


def backlog_bound_s(settings: Settings, tier: Tier) -> float | None:
    """Age (seconds) past which ``tier`` is shed, or None when it never is."""
    bound = settings.policy(tier).max_backlog_age
    return None if bound is None else settings.scaled(bound).total_seconds()


def shed_retry_after_s(settings: Settings) -> float:
    return max(1.0, settings.scaled(SHED_RETRY_AFTER).total_seconds())


class Admission:
    """The admission checks of one API process."""

    def __init__(self, settings: Settings, store: AdmissionStore) -> None:
        self.settings = settings
        self.store = store
        self._logged_at = -LOG_EVERY_S

    def buckets(self, tenant: TenantConfig, req: SendRequest) -> list[tuple[str, Bucket]]:
        """(reason, bucket) pairs a request must take a token from, in reason order."""
        out: list[tuple[str, Bucket]] = []
        if tenant.rate_limit is not None:
            out.append(("tenant_rate", one_second_bucket(self.store.tenant_key(tenant.id),
                                                         tenant.rate_limit)))
        if req.tier is Tier.P0:
            rate = p0_rate(self.settings, req.channel)
            if rate is not None:
                out.append(("p0_capacity",
                            one_second_bucket(self.store.p0_key(req.channel), rate)))
        return out

    async def check(self, tenant: TenantConfig, req: SendRequest) -> None:
        """Return when the request may be accepted; raise ``429`` or ``503`` otherwise."""
        try:
            await self._check_backlog(req.tier)
            await self._check_priority(req.tier)
            await self._take(tenant, req)
        except AdmissionUnavailable as exc:
            if req.tier in FAIL_OPEN_TIERS:
                self._log_fail_open(exc)
                return
            raise unavailable("admission_unavailable",
                              f"admission control is unavailable; {req.tier.value} is "
                              "not accepted until it is back") from None

    async def check_campaign(self, tier: Tier) -> None:
        """Return when a campaign of ``tier`` may start; ``429`` while the tier's backlog is
        past the share of its bound at which expanders stop (``campaigns.backlog_high``) or
        P0 is slow, ``503`` without the signals."""
        try:
            await self._check_backlog(tier, self.settings.campaigns.backlog_high)
            await self._check_priority(tier)
        except AdmissionUnavailable:
            raise unavailable("admission_unavailable", "admission control is unavailable; "
                              "campaigns are not accepted until it is back") from None

    async def _check_backlog(self, tier: Tier, share: float = 1.0) -> None:
        bound = backlog_bound_s(self.settings, tier)
        if bound is None:
            return
        bound *= share
        age = await self.store.backlog_age(tier)
        if age is not None and age > bound:
            raise rate_limited("backlog", f"tier {tier.value} is backlogged (oldest unsent "
                               f"message {age:.0f} s old, bound {bound:.0f} s); retry later",
                               shed_retry_after_s(self.settings))

    async def _check_priority(self, tier: Tier) -> None:
        """A bulk-lane tier waits while P0 is slow (``bulk_yield.high`` of its SLA)."""
        rule = self.settings.bulk_yield
        if not rule.enabled or self.settings.policy(tier).lane != "bulk":
            return
        sla = self.settings.policy(Tier.P0).sla.total_seconds()
        p0 = await self.store.p0_worst()
        if p0 is not None and p0 > rule.high * sla:
            raise rate_limited("priority_pressure", f"tier {tier.value} yields to P0, whose "
                               f"latency is {p0 * 1000:.0f} ms; retry later",
                               PRIORITY_RETRY_AFTER_S)

    async def _take(self, tenant: TenantConfig, req: SendRequest) -> None:
        pairs = self.buckets(tenant, req)
        if not pairs:
            return
        verdict = await self.store.take([b for _, b in pairs])
        if verdict.denied is None:
            return
        reason = pairs[verdict.denied][0]
        message = (f"tenant {tenant.id} exceeds its admission rate" if reason == "tenant_rate"
                   else f"P0 {req.channel.value} traffic exceeds the provider capacity")
        raise rate_limited(reason, message, verdict.wait_s)

    def _log_fail_open(self, exc: AdmissionUnavailable) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("admission control unavailable (%s); admitting P0/P1 unchecked, "
                        "refusing P2/P3", exc)
