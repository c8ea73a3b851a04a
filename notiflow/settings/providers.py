"""What every provider account shares: what the router knows about each, their circuit
breakers, the chat providers' section base and pace, and which provider endpoints count as
insecure outside development. Each provider's own section is in its plug-in
(``notiflow.providers.<name>.config``)."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from notiflow.chat_hooks import parse_prefix
from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.settings.section import _Frozen


class PaceRule(_Frozen):
    """How fast one chat webhook may be posted to (``adapters/webhook_pace.py``): ``rate``
    posts per second with bursts of ``burst``. A post the pace would put later waits, as
    ``RETRY_PENDING`` ``webhook_paced``, for the slot it is given."""

    rate: float = Field(gt=0)
    burst: int = Field(1, ge=1, le=1000)


def _webhook_prefixes(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    for p in prefixes:
        parse_prefix(p)
    return prefixes


WebhookPrefixes = Annotated[tuple[str, ...], AfterValidator(_webhook_prefixes)]
"""``scheme://host[:port]/path`` prefixes a chat provider posts to (:mod:`notiflow.chat_hooks`)."""


class ChatSettings(_Frozen):
    """An incoming-webhook chat provider: a message's recipient is the webhook URL (which is
    the credential), so the account has no secret; it serves the URLs under
    ``webhook_prefixes`` and nothing else, each at its ``pace``."""

    provider_id: str
    enabled: bool = True
    webhook_prefixes: WebhookPrefixes
    pace: PaceRule


class ProviderRoute(_Frozen):
    """What the provider router knows about one provider account."""

    provider_id: str
    channel: Channel
    cost: float = Field(1.0, ge=0)
    """Relative cost per message (cheapest wins for P3)."""
    reliability: float = Field(0.99, ge=0, le=1)
    """Configured delivery reliability (best wins for P0)."""
    countries: frozenset[str] = frozenset()
    """E.164 calling codes served (e.g. "1", "44"); empty = every country."""
    platforms: frozenset[PushPlatform] = frozenset()
    """Push platforms served; empty = all."""


class BreakerRule(_Frozen):
    """Circuit breaker of every provider account (docs/design.md, "Providers and circuit
    breakers"; docs/breakers.md).

    Durations are policy durations, multiplied by ``time_scale``, except
    ``latency_threshold``, which is compared with real provider latencies. Ratios are applied
    in basis points (rounded to 0.01 %).
    """

    window: timedelta = timedelta(seconds=30)
    """The rolling window of every opening rule."""
    buckets: int = Field(30, ge=1, le=3600)
    """Counters per window (error rate, latency): the window is ``buckets`` slots of
    ``window / buckets``."""
    failure_threshold: int = Field(5, ge=1, le=1000)
    """Opens at this many failures within ``window`` (exact times, not buckets)."""
    error_rate: float = Field(0.15, gt=0, lt=1)
    """Opens when failures / calls in the window exceed this ..."""
    min_calls: int = Field(20, ge=1)
    """... with at least this many calls in the window."""
    latency_threshold: timedelta = timedelta(seconds=2.5)
    """Opens when the window's ``latency_quantile`` latency exceeds this (not scaled) ..."""
    bulk_latency_threshold: timedelta = timedelta(seconds=30)
    """... on the bulk lane's breakers (``adapters/breaker_lanes.py``): a bulk flow at low
    CPU priority measures its own queueing as much as the provider's, and a slow provider
    opens the priority lane's breaker, which stops bulk too."""
    bulk_failure_threshold: int = Field(20, ge=1, le=1000)
    """``failure_threshold`` of the bulk lane's breakers. A bulk flow starved of CPU times
    out a few calls at once (five SMTP timeouts opened the bulk lane's breaker for a minute
    in an isolation run,
    ``docs/decisions/2026-12-01-bulk-timeouts-measured-by-starved-processes.md``); at bulk
    volumes a real outage
    opens it on ``error_rate`` within ``min_calls`` calls anyway."""
    latency_quantile: float = Field(0.99, gt=0, lt=1)
    min_latency_calls: int = Field(100, ge=1)
    """... with at least this many calls in the window (below 100 calls a p99 is the max)."""
    open_for: timedelta = timedelta(seconds=60)
    """OPEN lasts this long, then HALF_OPEN."""
    probe_share: float = Field(0.05, gt=0, le=1)
    """HALF_OPEN admits every ``round(1 / probe_share)``-th request of a process as a probe ..."""
    probe_gap: timedelta = timedelta(seconds=1)
    """... and, cluster-wide, one more whenever no probe was admitted for this long."""
    min_probes: int = Field(20, ge=1)
    close_ratio: float = Field(0.98, gt=0, le=1)
    """Closes once at least ``min_probes`` probes answered and this share of them succeeded
    (fast); any failed probe reopens."""
    max_probes: int = Field(100, ge=1)
    """Reopens when too many slow probes make ``close_ratio`` unreachable within this many."""
    throttle_reasons: frozenset[str] = frozenset({"rate_limited"})
    """Outcome reasons that are throttling: they lower the route weight and never count as
    failures."""
    throttle_factor: float = Field(0.5, gt=0, lt=1)
    """A throttled answer multiplies the route weight by this ..."""
    throttle_gap: timedelta = timedelta(seconds=1)
    """... at most once per this long (a burst of 429s is one signal)."""
    min_weight: float = Field(0.05, gt=0, le=1)
    weight_recovery: timedelta = timedelta(seconds=60)
    """The weight recovers linearly, from 0 to 1 in this long."""

    @model_validator(mode="after")
    def _consistent(self) -> BreakerRule:
        durations = (self.window, self.latency_threshold, self.bulk_latency_threshold,
                     self.open_for, self.probe_gap, self.throttle_gap, self.weight_recovery)
        if min(durations) <= timedelta(0):
            raise ValueError("breaker durations must be positive")
        if self.min_probes > self.max_probes:
            raise ValueError("min_probes must not exceed max_probes")
        return self


def insecure_endpoint(url: str) -> bool:
    """``url`` is plain ``http`` (or no URL) to a host that is not a loopback address."""
    parts = urlsplit(url.replace("://*.", "://", 1))
    if parts.scheme == "https":
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return parts.scheme != "http"
    try:
        return parts.scheme != "http" or not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def chat_enabled(section: ChatSettings) -> bool:
    """The chat provider is on and serves at least one webhook prefix."""
    return section.enabled and bool(section.webhook_prefixes)


def chat_endpoints(section: ChatSettings) -> list[tuple[str, str]]:
    return [("webhook_prefixes", prefix) for prefix in section.webhook_prefixes]
