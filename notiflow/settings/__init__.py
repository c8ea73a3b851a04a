"""The one settings object.

Every process builds exactly one frozen :class:`Settings` (env prefix ``NOTIFLOW_``, nested
keys joined by ``__``, optional TOML file named by ``NOTIFLOW_CONFIG``) and passes it
explicitly. Secrets (tenant tokens, provider credentials, the DLQ key) only ever come from the
environment or that file, never from code; the transport secrets towards Kafka, Cassandra and
Redis (``TRANSPORT_SECURITY``) from the environment only.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Iterable
from datetime import time, timedelta
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NestedSecretsSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from notiflow.chat_hooks import parse_prefix
from notiflow.schemas.enums import Category, Channel, PushPlatform, Tier


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetryBudget(_Frozen):
    """A tier's retry budget after transient failures (docs/architecture.md, "Retries,
    expiry and dead letters"; the schedule itself: ``flows/policy.py``). Retry ``n`` is due
    at a uniformly random time within its window ``[S(n-1), S(n))`` after the budget's first
    failure, ``S(n)`` being the sum of the first ``n`` caps: full jitter within each window,
    so the budget covers the sum of its caps however the draws fall."""

    attempts: int = Field(ge=1, le=100)
    """Attempts in all, the first and the failover included; after the last, the DLQ."""
    caps: tuple[timedelta, ...]
    """The width of each retry's window (``attempts - 1`` of them)."""
    span: timedelta
    """The design's bound: every attempt starts within it of the first failure (the caps
    sum to no more, and the tier's TTL is no shorter)."""
    failover_after: int = Field(1, ge=1, le=100)
    """Attempts the budget makes before each move to the next vendor (the account that
    failed the last one is then ranked last): 1 = every retry goes to the other vendor."""

    @model_validator(mode="after")
    def _fits(self) -> RetryBudget:
        if len(self.caps) != self.attempts - 1:
            raise ValueError(f"retry: {self.attempts} attempts need {self.attempts - 1} caps")
        if any(c < timedelta(0) for c in self.caps):
            raise ValueError("retry: caps may not be negative")
        if sum(self.caps, timedelta(0)) > self.span:
            raise ValueError("retry: the caps sum to more than the span")
        return self


class TierPolicy(_Frozen):
    """Per-tier defaults (docs/design.md, "Tiers")."""

    sla: timedelta
    ttl: timedelta
    retry: RetryBudget
    batch_size: int = Field(500, ge=1, le=10_000)
    poll_wait: timedelta = timedelta(milliseconds=20)
    """How long a send flow's worker waits in Kafka for its next ingest record (the wait ends
    when one arrives; ``adapters/kafka_group.py``). Meanwhile the worker does nothing else,
    so it bounds how late an idle flow's timers and send outcomes can be; shorter costs the
    idle flow CPU (more wake-ups)."""
    epoch: timedelta | None = None
    """Bytewax epoch length of the tier's send flow (``None``: ``flow_epoch_seconds``). At
    every epoch's end the worker stands still while it writes and fsyncs its recovery store,
    so a disk that stalls then holds every message of the tier for the rest of the stall
    (docs/decisions/2026-12-02-p0-epoch-length.md: the P0 flow's thread waiting in the block
    layer during
    a 1.2 s stall of the virtual disk). A longer epoch meets fewer stalls; what it costs is
    a longer stretch re-read after a crash, which the dedup leases make harmless."""
    max_in_flight: int = Field(64, ge=1, le=10_000)
    """Provider calls in flight at once, per channel, per worker."""
    max_queued: int = Field(256, ge=1, le=1_000_000)
    """Messages waiting per channel and worker before that channel's source pauses. Each
    waiting message is in every epoch's snapshot (pickled and written to the recovery
    store): beyond what keeps the in-flight slots busy, depth only costs CPU (P2 send flow
    1.38 ms/msg at 2000, 1.16 at 500; ``notiflow bench throughput``)."""
    provider_timeout: timedelta = timedelta(seconds=5)
    """How long one provider call may take before it counts as a timeout (ambiguous). It is
    measured by the tier's own event loop: a bulk tier's process is starved of CPU by design
    (``nice``), so its timeout must cover the seconds it waits for a core, not only the
    provider's answer."""
    redis_timeout: timedelta = timedelta(seconds=3)
    """Socket timeout of the tier's breaker and capacity calls to Redis: how soon the tier
    notices an unreachable Redis. P0/P1 fall back to local limits, so they notice fast; P2/P3
    pause either way, and a short timeout in a CPU-starved process reads a late event loop as
    "Redis unreachable" and pauses sends that Redis would have answered."""
    store_concurrency: int = Field(16, ge=1, le=1024)
    """Cassandra reads in flight per worker (the tier's share of the shared database)."""
    redis_down: Literal["local", "pause"] = "pause"
    """Without Redis: send on conservative local limits (no cluster dedup), or wait."""
    nice: int = Field(0, ge=-20, le=19)
    """CPU niceness of the tier's flow processes (reservation of CPU for higher tiers; a
    negative one needs ``CAP_SYS_NICE``, see ``notiflow/tuning.py``)."""
    realtime: int = Field(0, ge=0, le=99)
    """Above 0: the tier's processes run in the kernel's round-robin real-time class at this
    priority (``SCHED_RR``; they run as soon as they are runnable, ahead of every normal
    process; needs ``CAP_SYS_NICE``, else ``nice`` applies). 0: the normal scheduler."""
    max_backlog_age: timedelta | None = None
    """The API sheds this tier (429) when its oldest unsent message is older than this."""
    quiet_hours: bool = False
    """Whether the recipient's quiet hours defer this tier."""
    on_ambiguous: Literal["resend", "wait"] = "wait"
    """After an ambiguous provider outcome: send again (a duplicate beats a loss) or wait for
    a receipt to resolve it (UNKNOWN, FAILED ``ambiguous`` after ``unknown_resolution``)."""
    provider_batch: int = Field(1, ge=1, le=1000)
    """Most messages of this tier one provider request carries, where the provider takes
    several (SendGrid personalizations): sends that meet within ``provider_batch_linger``
    share a request, each message keeping its own result and status. 1: one request per
    message (what a latency tier wants). A batch never holds more than ``max_in_flight``
    messages, since each waits in its own in-flight slot."""
    provider_batch_linger: timedelta = timedelta(milliseconds=20)
    """How long the first send of a batch waits for others before the request goes out."""
    last_resort: bool = False
    """When every breaker of the channel refuses a message, send it through the best-ranked
    account anyway (a capacity token is still taken; the breaker is not told) instead of
    waiting for one to half-open; a transient failure then waits on the same attempt (no
    retry budget spent: ``last_resort_wait``, or a quarter of the message's age when longer,
    or the provider's ``Retry-After``) and tries the other account first. For P0: breakers
    open within a second of a 5xx or 429 storm and stay open a minute, P0's whole TTL, while
    both accounts still accept most sends (``notiflow chaos provider-5xx``: p99 60 s
    without it)."""
    last_resort_wait: timedelta = timedelta(milliseconds=250)
    lane: Literal["priority", "bulk"] = "bulk"
    """Which side of the shared bottlenecks the tier is on: ``bulk`` work yields to
    ``priority`` work (its own circuit breakers, throttled when P0's budget is threatened;
    docs/architecture.md, "Reservation at shared bottlenecks")."""

    @model_validator(mode="after")
    def _budget_within_ttl(self) -> TierPolicy:
        if self.retry.span > self.ttl:
            raise ValueError("retry.span exceeds the tier's ttl")
        return self


def _s(*seconds: float) -> tuple[timedelta, ...]:
    return tuple(timedelta(seconds=s) for s in seconds)


DEFAULT_TIERS: dict[Tier, TierPolicy] = {
    Tier.P0: TierPolicy(
        sla=timedelta(seconds=1),
        ttl=timedelta(seconds=60),
        retry=RetryBudget(attempts=3, caps=_s(0, 2), span=timedelta(seconds=60),
                          failover_after=2),
        batch_size=100,
        epoch=timedelta(seconds=30),
        max_in_flight=128,
        provider_timeout=timedelta(seconds=2),
        redis_timeout=timedelta(milliseconds=150),
        store_concurrency=64,
        redis_down="local",
        nice=-5,
        realtime=1,
        on_ambiguous="resend",
        last_resort=True,
        lane="priority",
    ),
    Tier.P1: TierPolicy(
        sla=timedelta(seconds=10),
        ttl=timedelta(minutes=30),
        retry=RetryBudget(attempts=5, caps=_s(10, 50, 300, 1320), span=timedelta(minutes=30)),
        batch_size=250,
        max_in_flight=64,
        redis_timeout=timedelta(seconds=0.5),
        redis_down="local",
        nice=2,
        on_ambiguous="resend",
        lane="priority",
    ),
    Tier.P2: TierPolicy(
        sla=timedelta(minutes=5),
        ttl=timedelta(hours=4),
        retry=RetryBudget(attempts=3, caps=_s(1800, 10800), span=timedelta(hours=4)),
        batch_size=500,
        max_in_flight=64,
        provider_timeout=timedelta(seconds=10),
        nice=10,
        max_backlog_age=timedelta(minutes=4),
        quiet_hours=True,
    ),
    Tier.P3: TierPolicy(
        sla=timedelta(hours=1),
        ttl=timedelta(hours=24),
        retry=RetryBudget(attempts=4, caps=_s(300, 1800, 7200), span=timedelta(seconds=9300)),
        batch_size=1000,
        max_in_flight=64,
        provider_timeout=timedelta(seconds=30),
        store_concurrency=8,
        nice=19,
        max_backlog_age=timedelta(minutes=30),
        quiet_hours=True,
        provider_batch=64,
        provider_batch_linger=timedelta(milliseconds=250),
    ),
}

DEFAULT_SHARES: dict[Tier, float] = {Tier.P0: 0.20, Tier.P1: 0.25, Tier.P2: 0.25, Tier.P3: 0.30}


class CapRule(_Frozen):
    """At most ``limit`` messages per recipient and category in any ``window``."""

    limit: int = Field(ge=0)
    window: timedelta


DEFAULT_CAPS: dict[Category, CapRule] = {
    Category.OTP: CapRule(limit=5, window=timedelta(minutes=10)),
    Category.MARKETING: CapRule(limit=3, window=timedelta(days=7)),
}


class QuietHours(_Frozen):
    """Local wall-clock window (start inclusive, end exclusive; may wrap midnight)."""

    start: time = time(22, 0)
    end: time = time(8, 0)


class JwtAuth(_Frozen):
    """Callers authenticated by OAuth2 client-credentials access tokens (JWTs) that an
    identity provider signs, verified against its JWKS (docs/api.md, "Authentication").
    Off while ``jwks_url`` is unset."""

    jwks_url: str | None = None
    issuer: str | None = None
    """The ``iss`` every token must carry (required once ``jwks_url`` is set)."""
    audience: str | None = None
    """The ``aud`` every token must name (required once ``jwks_url`` is set)."""
    algorithms: tuple[Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
                              "ES384", "ES512", "EdDSA"], ...] = ("RS256", "ES256")
    """Asymmetric algorithms only: a shared-secret algorithm with a published key would let
    anyone sign."""
    scope: str | None = "notiflow.send"
    """A scope the token's ``scope`` (space-separated) or ``scp`` (list) must contain; None:
    no scope check."""
    leeway: timedelta = timedelta(seconds=30)
    """Clock skew allowed on ``exp``, ``nbf`` and ``iat``."""
    tenant_claim: str = "tenant"
    """The claim naming the tenant (one of ``NOTIFLOW_TENANTS``, whose limits apply)."""
    tiers_claim: str = "tiers"
    channels_claim: str = "channels"
    templates_claim: str = "templates"
    senders_claim: str = "senders"
    """Optional claims (lists) that narrow what the tenant may send for this token; a token
    never widens its tenant's ``tiers``, ``channels``, ``templates`` or ``senders``."""
    keys_ttl: timedelta = timedelta(minutes=10)
    """How long fetched keys are used before the key set is fetched again."""
    min_refetch: timedelta = timedelta(seconds=30)
    """An unknown key id refetches the key set at most this often (rotation)."""
    static_tokens: bool = False
    """Whether the tenants' static tokens are still accepted beside JWTs once ``jwks_url`` is
    set (a migration); while JWTs are off, static tokens are the only credential."""

    @model_validator(mode="after")
    def _complete(self) -> JwtAuth:
        if self.jwks_url and not (self.issuer and self.audience):
            raise ValueError("jwt.jwks_url needs jwt.issuer and jwt.audience")
        return self

    @property
    def accepts_static_tokens(self) -> bool:
        """Static tokens authenticate: JWTs are off, or ``static_tokens`` asks for both."""
        return not self.jwks_url or self.static_tokens


def _sender_entry(entry: str) -> str:
    return entry.lower() if "@" in entry else entry


def sender_matches(entries: frozenset[str], sender: str) -> bool:
    """Whether ``entries`` (normalised by :func:`normalised_senders`) name ``sender``: an SMS
    number, short code or alphanumeric id exactly, an email address in any case, or any
    address at a domain listed as ``@domain``."""
    if sender in entries:
        return True
    if "@" not in sender:
        return False
    address = sender.lower()
    return address in entries or "@" + address.rsplit("@", 1)[1] in entries


def normalised_senders(entries: Iterable[str]) -> frozenset[str]:
    """Sender entries with email addresses and ``@domain`` entries in lower case."""
    return frozenset(_sender_entry(e) for e in entries)


def narrowed_senders(tenant: frozenset[str], token: frozenset[str]) -> frozenset[str]:
    """The entries naming exactly the senders both lists allow (a token's claim narrowing
    its tenant's ``senders``)."""
    return (frozenset(e for e in token if sender_matches(tenant, e))
            | frozenset(e for e in tenant if sender_matches(token, e)))


MIN_TOKEN_CHARS = 32
"""Shortest static bearer token a tenant may have."""
MIN_INBOX_KEY_BYTES = 32
"""Shortest HS256 inbox key (RFC 7518 3.2: a key as long as the hash output)."""
MIN_INGEST_KEY_BYTES = 32
"""Shortest ingest binding key (HMAC-SHA-256: a key as long as the hash output)."""
WEBHOOK_SECRET_BYTES = (24, 64)
"""Bytes a Standard Webhooks secret decodes to (after ``whsec_``)."""


def _webhook_secret_bytes(secret: str) -> int | None:
    """Bytes of a ``whsec_`` + base64 secret; None when it is not base64."""
    text = secret.strip().removeprefix("whsec_")
    try:
        return len(base64.b64decode(text + "=" * (-len(text) % 4), validate=True))
    except (binascii.Error, ValueError):
        return None


class TenantConfig(_Frozen):
    """A calling service: its bearer token and what it may send. Its secrets are checked
    for length at load; an error names the tenant and the field, never the value."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    token: SecretStr | None = None
    """The static bearer token (development; None: the tenant calls with JWTs only)."""
    tiers: frozenset[Tier] = frozenset(Tier)
    channels: frozenset[Channel] = frozenset(Channel)
    templates: frozenset[str] | None = None
    rate_limit: float | None = Field(None, gt=0)
    """Admission rate at the API (messages/s, burst of one second); None = unlimited."""
    daily_marketing_cap: int | None = Field(None, ge=0)
    """Marketing messages the tenant may send per UTC day; None = unlimited."""
    timezone: str = "UTC"
    """IANA zone a recurring schedule, or a campaign row of unknown zone, of the tenant's is
    evaluated in unless it names one."""
    max_active_campaigns: int | None = Field(None, ge=0)
    """Campaigns the tenant may have scheduled, running or paused at once (429 beyond);
    None = unlimited."""
    max_campaign_recipients: int | None = Field(None, ge=1)
    """Largest ``quota`` a campaign of the tenant's may have (422 beyond; a campaign without
    one gets this); None = unlimited."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise ValueError(f"unknown time zone {v!r}") from exc
        return v
    inbox_keys: tuple[SecretStr, ...] = ()
    """HS256 keys the tenant's backend signs its users' inbox tokens with (``docs/inbox.md``);
    every listed key verifies (rotation: add the new one, then drop the old). None: the
    tenant's users cannot open their inbox."""
    webhook_secrets: tuple[SecretStr, ...] = ()
    """Standard Webhooks signing secrets (``whsec_`` + base64) for the tenant's status
    webhooks; every listed secret signs (rotation: add the new one, then drop the old)."""
    ingest_keys: tuple[SecretStr, ...] = ()
    """HMAC-SHA-256 keys (at least 32 bytes) the tenant's direct producers sign the records
    they write to the ingest topics with (``notiflow/ingest_binding.py``); every listed key
    verifies (rotation: add the new one, then drop the old). Empty: the tenant's records
    reach the ingest topics only through the platform (API, campaigns, schedules)."""

    senders: frozenset[str] = frozenset()
    """Senders the tenant's messages may name (``sender``): SMS numbers, short codes and
    alphanumeric ids exactly, email addresses in any case, ``@domain`` for every address at a
    domain. Empty: only the provider accounts' own senders."""

    @field_validator("senders")
    @classmethod
    def _normalised_senders(cls, v: frozenset[str]) -> frozenset[str]:
        return normalised_senders(v)

    @model_validator(mode="after")
    def _secret_lengths(self) -> TenantConfig:
        if self.token is not None and len(self.token.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"tenant {self.id}: token must have at least {MIN_TOKEN_CHARS} "
                             "characters")
        for i, key in enumerate(self.inbox_keys):
            if len(key.get_secret_value().encode()) < MIN_INBOX_KEY_BYTES:
                raise ValueError(f"tenant {self.id}: inbox_keys[{i}] must have at least "
                                 f"{MIN_INBOX_KEY_BYTES} bytes")
        for i, key in enumerate(self.ingest_keys):
            if len(key.get_secret_value().encode()) < MIN_INGEST_KEY_BYTES:
                raise ValueError(f"tenant {self.id}: ingest_keys[{i}] must have at least "
                                 f"{MIN_INGEST_KEY_BYTES} bytes")
        low, high = WEBHOOK_SECRET_BYTES
        for i, secret in enumerate(self.webhook_secrets):
            size = _webhook_secret_bytes(secret.get_secret_value())
            if size is None or not low <= size <= high:
                raise ValueError(f"tenant {self.id}: webhook_secrets[{i}] must be whsec_ + "
                                 f"base64 of {low} to {high} bytes")
        return self

    def allows_template(self, template_id: str) -> bool:
        return self.templates is None or template_id in self.templates

    def allows_sender(self, sender: str | None) -> bool:
        """No sender (the account's own), or one of :attr:`senders`."""
        return sender is None or sender_matches(self.senders, sender)


class ClientWebhookRule(_Frozen):
    """Delivery of status webhooks to tenants (Standard Webhooks / Svix retry schedule)."""

    schedule: tuple[timedelta, ...] = (
        timedelta(0), timedelta(seconds=5), timedelta(minutes=5), timedelta(minutes=30),
        timedelta(hours=2), timedelta(hours=5), timedelta(hours=10), timedelta(hours=10))
    """Wait before each attempt (scaled by ``time_scale``); after the last one → DLQ."""
    timeout: timedelta = timedelta(seconds=5)
    """Per request (not scaled by ``time_scale``); a timeout counts as a failed attempt."""
    max_in_flight: int = Field(64, ge=1)
    max_per_endpoint: int = Field(16, ge=1)
    """POSTs in flight to one endpoint (scheme, host, port), so a slow one cannot take every
    slot of ``max_in_flight``."""
    statuses: frozenset[str] = frozenset()
    """Statuses that trigger a webhook; empty = every status change."""


class EgressSettings(_Frozen):
    """Where tenant-supplied URLs (status webhooks, campaign webhooks) may lead
    (``notiflow/egress.py``): public unicast addresses over ``https`` only, unless allowed
    here. The cloud metadata addresses are refused whatever these say."""

    allow_http: bool = False
    """Accept ``http://`` URLs (the development environment of ``notiflow.devenv``)."""
    allow_networks: tuple[IPv4Network | IPv6Network, ...] = ()
    """Addresses accepted although not public (``["127.0.0.0/8"]`` for the emulators)."""
    allow_hosts: tuple[str, ...] = ()
    """Host names whose resolved addresses are accepted although not public (an in-cluster
    receiver, by its exact name)."""
    resolve_timeout: timedelta = timedelta(seconds=2)
    """Longest wait for one name's addresses; a name that does not resolve within it is
    refused (422 at acceptance, a retried attempt at send time)."""
    resolvers: int = Field(8, ge=1, le=64)
    """Threads per process that resolve tenant host names (apart from the loop's own)."""

    @field_validator("allow_hosts")
    @classmethod
    def _lower_hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.strip().lower().rstrip(".") for h in v if h.strip())


class DlqRule(_Frozen):
    """When dead-lettering signals a systemic bug rather than bad data."""

    depth_alert: int = Field(10_000, ge=1)
    """Alert (log + metric) above this many unresolved records in a DLQ topic."""
    max_consecutive: int = Field(100, ge=1)
    """Halt the consumer after this many dead letters in a row."""
    max_ratio: float = Field(0.5, gt=0, le=1)
    """... or when more than this share of the last ``ratio_window`` records went there."""
    ratio_window: int = Field(1000, ge=10)
    quarantine_after: int = Field(50, ge=1)
    """Invalid records from one source (tenant or producer) within the last ``ratio_window``
    outputs that quarantine it: a ``PRODUCER_QUARANTINE`` alert, its records dead-lettered,
    the flow going on (``flows/guard.py``)."""
    systemic_sources: int = Field(3, ge=2)
    """Distinct sources of invalid records within the window from which invalid records
    count toward the halt (a schema change breaks every producer; one producer's bad deploy
    breaks one)."""
    max_crashes: int = Field(3, ge=1)
    """A source batch that crashed the flow this often is dead-lettered on the next start."""


class RenderLimits(_Frozen):
    """The budget of one template render (docs/api.md, "Templates"); a render over any of
    them fails (``render_error``) instead of running on."""

    cpu_time: timedelta = Field(timedelta(milliseconds=50), gt=timedelta(0))
    """CPU time of the rendering thread per render (subject and body together)."""
    max_output: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Characters of a rendered subject or body, and of any string or sequence a template
    builds; everything its expressions output, at every macro level, may total four times
    this."""
    max_int_bits: int = Field(4096, ge=64, le=1 << 20)
    """Bits of any integer a template computes."""
    max_range: int = Field(10_000, ge=1, le=1_000_000)
    """Items of one ``range()``."""
    max_iterations: int = Field(100_000, ge=1)
    """Loop iterations per render, all loops together."""
    max_depth: int = Field(20, ge=1, le=100)
    """Nested calls (macros, ``caller()``, recursive loops)."""


NEVER_URGENT: frozenset[Category] = frozenset({Category.MARKETING})
"""Categories no configuration may allow at P0 or P1."""


class CategoryTiers(_Frozen):
    """Which tiers each message category may use, for every tenant: a category not listed
    may use any tier its tenant may. Marketing is never P0 or P1 (it would skip quiet hours
    and marketing caps and take the urgent lanes); configuration may narrow, never widen
    that."""

    allowed: dict[Category, frozenset[Tier]] = Field(
        default_factory=lambda: {Category.MARKETING: frozenset({Tier.P2, Tier.P3})})

    @model_validator(mode="after")
    def _never_urgent(self) -> CategoryTiers:
        for category in NEVER_URGENT:
            urgent = self.tiers(category) & {Tier.P0, Tier.P1}
            if urgent:
                raise ValueError(f"category_tiers: {category.value} may not use "
                                 f"{', '.join(sorted(t.value for t in urgent))}")
        return self

    def tiers(self, category: Category) -> frozenset[Tier]:
        """The tiers ``category`` may use: as listed, else P2 and P3 for a category in
        :data:`NEVER_URGENT`, else every tier."""
        listed = self.allowed.get(category)
        if listed is not None:
            return listed
        return frozenset({Tier.P2, Tier.P3} if category in NEVER_URGENT else Tier)

    def allows(self, category: Category, tier: Tier) -> bool:
        return tier in self.tiers(category)


class IngestEncryption(_Frozen):
    """Envelope encryption of the recipient and variables of ingest records
    (``adapters/envelope.py``): each process seals with a data key of its own, wrapped by the
    first key-encryption key; every listed key opens."""

    keys: SecretStr | None = None
    """Key-encryption keys, ``kid:key`` separated by commas (``key``: 32 random bytes,
    URL-safe base64). None: records travel in clear. Rotation: put the new key first, drop
    the old one once no record sealed under it can still be read (the ingest topics'
    retention and the longest schedule)."""
    required: bool = False
    """Dead-letter ingest records whose recipient and variables arrive in clear (an upstream
    producer writing to the ingest topics without the key)."""
    data_key_ttl: timedelta = timedelta(minutes=5)
    """How long a process seals with one data key before drawing the next."""


class IngestBinding(_Frozen):
    """Ingest records bound to their tenant (``notiflow/ingest_binding.py``): an HMAC header
    by the platform key or by a key of the tenant the record names."""

    keys: SecretStr | None = None
    """Platform keys (at least 32 bytes each) every platform writer signs with, comma
    separated: the first signs, every one verifies. Unset: one derived from each
    ``dlq_key``."""
    required: bool | None = None
    """Dead-letter records that carry no binding (``tenant_claim_refused``). None: required
    outside ``development``. A binding that does not verify is refused either way."""


class TwilioSettings(_Frozen):
    """Twilio Messages API account; the base URL points at Twilio or at ``notiflow fakes``."""

    provider_id: str = "twilio"
    base_url: str = "http://127.0.0.1:18090/twilio"
    account_sid: str = "AC00000000000000000000000000000000"
    auth_token: SecretStr | None = None
    from_number: str = "+15005550006"
    status_callback_url: str | None = None


class SendGridSettings(_Frozen):
    """SendGrid v3 Mail Send account; the base URL points at SendGrid
    (``https://api.sendgrid.com``) or at ``notiflow fakes``."""

    provider_id: str = "sendgrid"
    base_url: str = "http://127.0.0.1:18090/sendgrid"
    api_key: SecretStr | None = None
    from_email: str = "notifications@example.com"
    """A verified Sender Identity of the account."""
    from_name: str | None = "notiflow"
    event_webhook_url: str | None = None
    """Where the account's Event Webhook posts (set in the SendGrid account, not per message);
    the emulator posts there when its ``callbacks_enabled`` knob is on."""
    event_webhook_public_key: str | None = None
    """Verification key of the signed Event Webhook: base64 DER (SubjectPublicKeyInfo) of an
    ECDSA P-256 key, as SendGrid shows it."""
    event_webhook_signing_key: SecretStr | None = None
    """Emulator only: the PEM private key ``notiflow fakes`` signs events with (SendGrid keeps
    its own); never set in production."""
    max_personalizations: int = Field(1000, ge=1, le=1000)
    """Most recipients one Mail Send request carries when a tier batches its email
    (``provider_batch``); SendGrid's own limit is 1,000."""


class SesSettings(_Frozen):
    """Amazon SES v2 (``SendEmail``) with an IAM access key; requests are signed with AWS
    Signature Version 4 (botocore). ``endpoint_url`` is ``https://email.<region>.amazonaws.com``
    or ``notiflow fakes``. SES is an email route once the key is configured."""

    provider_id: str = "ses"
    endpoint_url: str = "http://127.0.0.1:18090/ses"
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    """Temporary credentials (an assumed role) carry one."""
    from_email: str = "notifications@example.com"
    """A verified identity (address or domain) of the account."""
    configuration_set: str | None = None
    """The configuration set whose event destination publishes delivery events (SNS)."""
    sns_topic_arns: tuple[str, ...] = ()
    """The SNS topics whose deliveries ``POST /webhooks/ses`` takes (SES events); none:
    every post is refused."""
    sns_host_pattern: str = r"sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?"
    """Hosts a ``SigningCertURL`` or ``SubscribeURL`` may name (a regular expression the
    whole host must match): SNS's public endpoints."""
    sns_require_https: bool = True
    """Off only for the emulator on loopback."""
    sns_cert_ttl: timedelta = timedelta(hours=24)
    """How long a fetched signing certificate is used before it is fetched again."""
    sns_max_age: timedelta = Field(timedelta(hours=1), gt=timedelta(0))
    """Oldest (and furthest future) ``Timestamp`` a delivery may carry; older ones are
    refused as replays. Keep it above the subscription's retry span (SNS's default policy
    retries for about 20 seconds). Wall-clock, not scaled by ``time_scale``."""
    sns_signature_v1: bool = False
    """Also accept ``SignatureVersion`` 1 (SHA-1); off: only 2 (SHA-256), which the topic
    must be set to (its ``SignatureVersion`` attribute)."""


class FcmSettings(_Frozen):
    """Firebase Cloud Messaging HTTP v1 with a service account; ``base_url`` points at
    ``https://fcm.googleapis.com`` and ``token_uri`` at ``https://oauth2.googleapis.com/token``,
    or both at ``notiflow fakes``."""

    provider_id: str = "fcm"
    base_url: str = "http://127.0.0.1:18090/fcm"
    project_id: str = "notiflow-dev"
    client_email: str | None = None
    """The service account's ``client_email``."""
    private_key: SecretStr | None = None
    """The service account's RSA ``private_key`` (PEM)."""
    private_key_id: str | None = None
    token_uri: str = "http://127.0.0.1:18090/fcm/token"


class VonageSettings(_Frozen):
    """Vonage SMS API account (second SMS vendor); ``base_url`` points at
    ``https://rest.nexmo.com`` or at ``notiflow fakes``."""

    provider_id: str = "vonage"
    base_url: str = "http://127.0.0.1:18090/vonage"
    api_key: str | None = None
    api_secret: SecretStr | None = None
    signature_secret: SecretStr | None = None
    """Shared secret of signed requests / delivery receipts (Vonage "signature secret")."""
    from_name: str = "Notiflow"
    status_callback_url: str | None = None
    """Delivery-receipt webhook (``callback`` per message, or the account default)."""


class SmtpSettings(_Frozen):
    """An SMTP relay (second email route); ``notiflow fakes`` serves one on ``port``."""

    provider_id: str = "smtp"
    host: str = "127.0.0.1"
    port: int = 18025
    username: str | None = None
    password: SecretStr | None = None
    starttls: bool = False
    from_email: str = "notifications@example.com"
    max_connections: int = Field(50, ge=1, le=1000)
    """Concurrent SMTP connections per send process (one transaction at a time each; 50 is
    Postfix's default per-client limit). A send waiting longer than half its timeout for one
    fails as ``pool_exhausted`` (transient, counted by the breaker), so this should cover the
    email sends a tier keeps in flight (``max_in_flight``): with 4, and with 16, the
    benchmark's campaign flood queued sends behind a slow relay until they failed."""
    dsn_webhook_secret: SecretStr | None = None
    """Bearer token the relay's bounce pipe sends to ``POST /webhooks/smtp-dsn``; unset, every
    DSN post is refused."""
    dsn_webhook_url: str | None = None
    """Where the relay's bounce pipe posts DSNs (configured in the MTA, not here); the
    emulator posts its DSNs there."""


class ApnsSettings(_Frozen):
    """Apple Push Notification service with a token-based (ES256 JWT) provider key;
    ``base_url`` points at ``https://api.push.apple.com`` or at ``notiflow fakes``."""

    provider_id: str = "apns"
    base_url: str = "https://127.0.0.1:18443"
    team_id: str | None = None
    key_id: str | None = None
    private_key: SecretStr | None = None
    """The .p8 signing key (PEM, EC P-256)."""
    topic: str = "com.example.notiflow"
    """The app's bundle id (``apns-topic``)."""
    ca_file: str | None = None
    """Extra CA certificate to trust (the emulator's test CA); None = system trust."""


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


class SlackSettings(_Frozen):
    """Slack incoming webhooks: a message's recipient is the webhook URL (which is the
    credential), so the provider has no account secret; it serves the URLs under
    ``webhook_prefixes`` and nothing else."""

    provider_id: str = "slack"
    enabled: bool = True
    webhook_prefixes: WebhookPrefixes = ("https://hooks.slack.com/services/",)
    pace: PaceRule = PaceRule(rate=1.0, burst=1)
    """Slack allows one post per second per webhook, with short bursts it does not promise."""


class TeamsSettings(_Frozen):
    """Microsoft Teams incoming webhooks: Workflows (Power Automate) webhooks answer ``202``
    and the retired Office 365 connectors ``200`` ``1``; the recipient is the URL."""

    provider_id: str = "teams"
    enabled: bool = True
    webhook_prefixes: WebhookPrefixes = (
        "https://*.webhook.office.com/webhookb2/",
        "https://*.logic.azure.com/workflows/",
        "https://*.environment.api.powerplatform.com/powerautomate/automations/direct/",
    )
    pace: PaceRule = PaceRule(rate=2.0, burst=4)
    """Teams connectors take 4 posts in a second and 60 in 30 seconds per webhook; its longer
    windows (100 an hour) answer ``429``, which the message then waits out."""


class ServerLimits(_Frozen):
    """What one HTTP server process takes at once (docs/api.md, "Limits"): beyond
    ``max_concurrency`` open connections or requests in progress a new request is answered
    ``503``; the kernel queues ``backlog`` connections not accepted yet; an idle keep-alive
    connection is closed after ``keep_alive``; a request line and headers that pass
    ``max_head_bytes`` unfinished close the connection."""

    max_concurrency: int = Field(1000, ge=1, le=1_000_000)
    backlog: int = Field(2048, ge=1, le=65535)
    keep_alive: timedelta = timedelta(seconds=5)
    max_head_bytes: int = Field(64 * 1024, ge=1024, le=1024 * 1024)


class InboxSettings(_Frozen):
    """The in-app channel (``docs/inbox.md``): messages to ``inapp:<user id>`` are stored in
    the user's inbox (Cassandra) by the send flow and pushed live by ``notiflow inbox`` to the
    user's open apps (WebSocket, or server-sent events), which authenticate with a user token
    signed by their tenant (``TenantConfig.inbox_keys``)."""

    provider_id: str = "inbox"
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(18110, ge=1, le=65535)
    """Where ``notiflow inbox`` listens."""
    retention: timedelta = timedelta(days=30)
    """How long an inbox item is kept (Cassandra TTL)."""
    page_size: int = Field(50, ge=1, le=500)
    """Items per page of ``GET /v1/inbox`` unless ``limit`` asks for fewer or more."""
    max_page: int = Field(200, ge=1, le=1000)
    token_audience: str = "notiflow-inbox"
    """The ``aud`` every user token must name."""
    max_token_lifetime: timedelta = timedelta(hours=24)
    """Longest ``exp - iat`` a user token may have."""
    token_leeway: timedelta = timedelta(seconds=30)
    max_connections_per_user: int = Field(10, ge=1, le=1000)
    """Live connections of one user (a new one beyond closes the oldest)."""
    send_queue: int = Field(256, ge=1, le=100_000)
    """Frames waiting for a slow client before its connection is closed (it reconnects and
    catches up from the inbox)."""
    heartbeat: timedelta = timedelta(seconds=25)
    """Ping (WebSocket) or comment (SSE) interval, so proxies keep idle connections."""
    max_connections: int = Field(20_000, ge=1, le=1_000_000)
    """Live connections of this process, all tenants together: one more is refused ``503``
    before the upgrade."""
    max_connections_per_tenant: int = Field(5_000, ge=1, le=1_000_000)
    """Live connections of one tenant's users in this process: one more is refused ``429``
    before the upgrade."""
    connect_rate: float = Field(50.0, gt=0)
    """Connections per second one tenant's users may open (a token bucket of
    ``connect_burst``): a faster one is refused ``429`` with ``Retry-After``."""
    connect_burst: int = Field(200, ge=1)
    server: ServerLimits = ServerLimits()
    """The process's listen backlog and keep-alive; ``max_concurrency`` and
    ``max_head_bytes`` do not apply (the connection caps above do, and aiohttp bounds a
    request's head itself: 8190-byte lines and fields, 128 headers)."""


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


DEFAULT_ROUTES: tuple[ProviderRoute, ...] = (
    ProviderRoute(provider_id="twilio", channel=Channel.SMS, cost=1.0, reliability=0.995),
    ProviderRoute(provider_id="vonage", channel=Channel.SMS, cost=0.8, reliability=0.99),
    ProviderRoute(provider_id="sendgrid", channel=Channel.EMAIL, cost=1.0, reliability=0.995),
    ProviderRoute(provider_id="smtp", channel=Channel.EMAIL, cost=0.4, reliability=0.98),
    ProviderRoute(provider_id="ses", channel=Channel.EMAIL, cost=0.3, reliability=0.99),
    ProviderRoute(provider_id="fcm", channel=Channel.PUSH, reliability=0.995,
                  platforms=frozenset({PushPlatform.ANDROID, PushPlatform.WEB})),
    ProviderRoute(provider_id="apns", channel=Channel.PUSH, reliability=0.995,
                  platforms=frozenset({PushPlatform.IOS})),
    ProviderRoute(provider_id="slack", channel=Channel.CHAT, reliability=0.995),
    ProviderRoute(provider_id="teams", channel=Channel.CHAT, reliability=0.99),
    ProviderRoute(provider_id="inbox", channel=Channel.INAPP, cost=0.0, reliability=0.999),
)


class YieldRule(_Frozen):
    """How bulk work yields to P0 (``flows/yielding.py``): the signal is the worst P0 latency
    the priority lane reports (``adapters/pressure.py``), compared with P0's SLA. Above
    ``high`` of the SLA a bulk flow halves its in-flight window every ``tick`` (down to
    ``floor`` slots), below ``low`` it grows by ``increase`` of its ceiling per tick; the
    bulk-lane API refuses bulk acceptances (429) above ``high``; the reconciler applies at
    most the same window of bulk writes at once, after the priority lane's."""

    high: float = Field(0.35, gt=0, le=1)
    low: float = Field(0.2, gt=0, le=1)
    decrease: float = Field(0.5, gt=0, lt=1)
    increase: float = Field(0.05, gt=0, le=1)
    floor: int = Field(0, ge=0)
    """Fewest slots a bulk flow keeps while P0 is slow. 0 (the default) pauses its sends and
    its intake outright until the signal is back below ``high``: a window of one slot per
    channel still kept the P3 flow at a third of a core (p99 1,419 and 1,430 ms vs 942 ms at
    0, ``docs/decisions/2026-12-01-p0-reservation-at-shared-bottlenecks.md``). The price:
    while P0 is slow for a reason bulk
    does not cause (a slow P0 provider), bulk waits too. The reconciler keeps at least one."""
    start: float = Field(0.1, gt=0, le=1)
    """Share of the ceiling a bulk process starts with (slow start)."""
    tick: timedelta = timedelta(milliseconds=250)
    enabled: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> YieldRule:
        if self.low > self.high:
            raise ValueError("bulk_yield: low must not exceed high")
        return self


class OutageWindow(_Frozen):
    """How one API process accepts while Kafka does not acknowledge (docs/design.md,
    "Failures of the stores"; ``gateway/kafka_window.py``, docs/api.md "Kafka outage"). Not
    scaled by ``time_scale``."""

    max_messages: int = Field(20_000, ge=0)
    """P1-P3 acceptances answered ``202`` from Cassandra's durability alone and not yet
    published, per API process; beyond, ``503`` with ``Retry-After``. 0: no window."""
    max_age: timedelta = Field(timedelta(minutes=10), gt=timedelta(0))
    """The oldest unpublished record may be this old; beyond, new acceptances get ``503``."""
    ack_wait: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How long a P1-P3 request waits for Kafka's ack before it is answered from the
    window."""
    p0_ack_wait: timedelta = Field(timedelta(milliseconds=400), gt=timedelta(0))
    """How long a P0 request waits for the ack before it is refused: P0 must reach its
    provider within a second, so it is never deferred."""
    probe_interval: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How often a process with deferred records (or that saw Kafka fail) tries Kafka."""
    drain_concurrency: int = Field(256, ge=1)
    """Deferred records in flight to Kafka at once while the window drains."""


class SchedulingRule(_Frozen):
    """Durable scheduling (``flows/scheduler.py``, docs/architecture.md "Scheduling"): a
    P2/P3 message due ``min_lead`` or more after acceptance waits in Cassandra's
    ``scheduled_work`` (partition ``(time_bucket, shard)``) instead of Kafka, and a scheduler
    process publishes it when due. Not scaled by ``time_scale`` (bucket layout is storage)."""

    bucket: timedelta = Field(timedelta(minutes=1), ge=timedelta(seconds=1))
    """Width of a time bucket: one partition per (bucket, shard)."""
    shards: int = Field(16, ge=1, le=1024)
    """Partitions per bucket; the unit a scheduler process leases."""
    min_lead: timedelta = Field(timedelta(seconds=2), gt=timedelta(0))
    """A message due sooner than this after its acceptance goes straight to Kafka (the send
    flow's hold step keeps it until due); a later one waits in a bucket, and its row must be
    written within half of this or the acceptance fails (503, completed later by the
    outbox), so a scheduler reading up to now never passes a row still being written."""
    lease: timedelta = Field(timedelta(seconds=1), ge=timedelta(milliseconds=300))
    """How long a scheduler's claim on its shards lasts unless renewed (every quarter of it,
    all its shards in one lightweight transaction). A killed scheduler's shards wait this
    long for another: the lateness its rows see."""
    poll: timedelta = Field(timedelta(milliseconds=250), gt=timedelta(0))
    """How often a scheduler reads its shards' due rows."""
    lookback: timedelta = Field(timedelta(hours=1), ge=timedelta(0))
    """Where a shard nobody ever released starts reading; afterwards every owner resumes
    from the shard's watermark (the oldest bucket not fully released)."""
    page: int = Field(500, ge=1, le=10_000)
    """Rows read per query and published per round trip to Kafka."""
    horizon: timedelta = Field(timedelta(hours=1), gt=timedelta(0))
    """How far ahead a recurring schedule's occurrences become messages (``SCHEDULED``, in
    buckets): pausing or deleting a schedule cancels those already made."""
    materialize_every: timedelta = Field(timedelta(seconds=10), gt=timedelta(0))
    """How often a scheduler materialises the schedules of its shards."""
    min_interval: timedelta = Field(timedelta(minutes=1), gt=timedelta(0))
    """Closest two occurrences of a recurring schedule may be (422 otherwise)."""
    long_wait: timedelta = Field(timedelta(seconds=30), gt=timedelta(0))
    """A retry (or a wait for a breaker) due this long or more after it is decided leaves
    the send flow through ``notify.delayed`` and waits in a bucket, not in flow state
    (compared with the scaled wait, so a test at a small ``time_scale`` keeps it in the
    flow)."""


class CampaignRule(_Frozen):
    """Campaign expansion (``flows/expander.py``, docs/architecture.md "Campaigns"): expander
    processes lease running campaigns and turn manifest rows into P2/P3 messages at the
    campaign's rate, slowed by P0's latency signal and stopped while the tier's oldest
    unsent message is older than ``backlog_high`` of its shed bound."""

    poll: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How often an expander looks for campaigns to take and checks the ones it holds."""
    lease: timedelta = Field(timedelta(seconds=10), ge=timedelta(seconds=1))
    """How long an expander's claim on a campaign lasts unless renewed (every batch): a
    killed expander's campaign waits this long for another."""
    batch: int = Field(500, ge=1, le=10_000)
    """Rows expanded between checkpoints (one Kafka round, one progress write)."""
    chunk_bytes: int = Field(1 << 20, ge=4096)
    """Bytes read from the manifest per request."""
    max_per_expander: int = Field(4, ge=1, le=64)
    """Campaigns one expander process expands at once."""
    default_rate: float = Field(500.0, gt=0)
    """Messages/s of a campaign that names no ``max_rate``."""
    max_rate: float = Field(5_000.0, gt=0)
    """Highest ``max_rate`` a campaign may ask for (422 above)."""
    default_duration: timedelta = Field(timedelta(days=1), gt=timedelta(0))
    """Window of a campaign that names no ``ends_at``."""
    max_duration: timedelta = Field(timedelta(days=30), gt=timedelta(0))
    backlog_high: float = Field(0.5, gt=0, le=1)
    """Expansion stops while the tier's oldest unsent message is older than this share of
    the tier's ``max_backlog_age`` (and resumes below it): the queue never becomes the
    incident. Admission refuses new campaigns (429) in the same state."""
    error_bucket: int = Field(100_000, ge=1)
    """Rows per partition of a campaign's error report."""
    file_root: Path | None = None
    """Directory ``file://`` manifests must lie in (embedded, single-machine use); None:
    only ``s3://`` manifests are accepted, so a tenant cannot name a file of the server."""
    manifest_bucket: str | None = None
    """The bucket tenants' ``s3://`` manifests are in; None: ``object_store.bucket``."""
    manifest_prefix: str = Field("tenants", pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
    """A tenant's manifests are the objects under ``<manifest_prefix>/<tenant id>/`` of
    ``manifest_bucket`` (or of ``file_root``); a campaign naming any other object is refused
    before it is read (``adapters/manifests.py``)."""


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


class ArchiveSettings(_Frozen):
    """The history archive (``notiflow/archive.py``, ``notiflow archive``) and what ``notiflow
    report`` reads."""

    uri: str = "s3://notiflow/archive"
    """Where the archive lives: ``s3://bucket/prefix`` or ``file:///abs/dir``."""
    settle: timedelta = timedelta(days=2)
    """How old a day must be before it is archived: its retries, receipts and expiries are
    done (and it is still well inside ``operational_ttl``)."""
    slice: int = Field(2000, ge=1, le=100_000)
    """Messages read and encoded at a time (a Parquet row group each)."""
    concurrency: int = Field(64, ge=1, le=1024)
    """Most Cassandra reads in flight (P0's latency signal narrows it, ``bulk_yield``)."""


class TelemetrySettings(_Frozen):
    """OpenTelemetry export of traces and metrics (``notiflow.telemetry``); off by default."""

    exporter: Literal["off", "console", "otlp-grpc", "otlp-http"] = "off"
    """``off``: no SDK (trace context is still passed on); ``console``: spans and
    metrics as JSON on stdout; ``otlp-grpc`` / ``otlp-http``: to an OTLP receiver."""
    endpoint: str | None = None
    """OTLP endpoint (gRPC ``http://127.0.0.1:4317``, HTTP ``http://127.0.0.1:4318``);
    None = the SDK's default or ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    service_name: str | None = None
    """Overrides ``service.name``; None = ``notiflow-<process>`` (``notiflow-api``,
    ``notiflow-send-p0``, ``notiflow-reconcile``, ``notiflow-webhooks``)."""
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    """Extra resource attributes (e.g. ``deployment.environment``)."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of new traces recorded; a continued trace follows its parent's decision."""
    metric_interval: timedelta = timedelta(seconds=10)
    """How often metrics are exported (not scaled by ``time_scale``; ISO 8601 in the
    environment, e.g. ``PT1S``)."""


class ObjectStoreSettings(_Frozen):
    """Object storage (``adapters/object_store.py``): ``file://`` URIs need nothing, ``s3://``
    URIs go to ``endpoint`` signed with these credentials (unset: the AWS default chain,
    ``AWS_ACCESS_KEY_ID`` or an instance role). The local stack serves ``endpoint`` with
    SeaweedFS (``weed server -s3``) on the ports below, all on loopback."""

    endpoint: str = "http://127.0.0.1:18333"
    region: str = "us-east-1"
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    allow_http: bool = True
    """Whether a plain ``http://`` endpoint is allowed (the local stack's)."""
    virtual_hosted_style: bool = False
    """``bucket.host`` requests instead of ``host/bucket`` (then ``endpoint`` names the
    bucket); path style suits SeaweedFS, MinIO and AWS alike."""
    connect_timeout: timedelta = timedelta(seconds=5)
    timeout: timedelta = timedelta(minutes=5)
    """Longest a request may take, reading its body included (a slow reader of a stream
    loses it after this and resumes from its offset)."""
    max_retries: int = Field(3, ge=0, le=20)
    """Retries of a failed request (with backoff) before the store counts as unavailable."""
    bucket: str = "notiflow"
    """The bucket ``notiflow stack up`` creates."""
    seaweedfs_version: str = "v0.0.0-20261109003541-7506e5f91cd6"
    """Go module version of ``github.com/seaweedfs/seaweedfs`` that ``notiflow stack fetch``
    builds ``weed`` from (SeaweedFS 4.53)."""
    s3_port: int = 18333
    master_port: int = 19333
    volume_port: int = 18380
    filer_port: int = 18888
    """HTTP ports of the local SeaweedFS; each serves gRPC on its port + 10000."""
    memory_limit_mb: int = Field(512, ge=256)
    """Soft memory limit of the local SeaweedFS process (``GOMEMLIMIT``). Its filer keeps
    about 130 MB of heap from the start (metadata log buffers, LevelDB memtables), and a limit
    close to the live heap keeps the collector running while idle (with LevelDB's default
    buffers, 250 MB of heap under a 256 MB limit: 6 % of a core)."""


KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class TlsFiles(_Frozen):
    """TLS towards a store: whom to trust, the client's own certificate (mutual TLS), and
    whether the server's certificate must name the host connected to. Paths are read by the
    clients, not here."""

    ca_file: Path | None = None
    """PEM bundle of the CA(s) that signed the servers' certificates; None: the system's
    trust store."""
    cert_file: Path | None = None
    """PEM client certificate for mutual TLS (with ``key_file``)."""
    key_file: Path | None = None
    """PEM private key of ``cert_file``."""
    key_password: SecretStr | None = None
    """Password of an encrypted ``key_file`` (environment only)."""
    check_hostname: bool = True
    """Whether the server's certificate must name the address connected to. Off, the chain
    is still verified against ``ca_file``."""

    @property
    def tls_files(self) -> bool:
        """Whether any TLS file or key password is configured."""
        return any(v is not None for v in (self.ca_file, self.cert_file, self.key_file,
                                           self.key_password))

    @model_validator(mode="after")
    def _key_pair(self) -> TlsFiles:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.key_password is not None and self.key_file is None:
            raise ValueError("key_password without key_file")
        return self


class KafkaSecurity(TlsFiles):
    """Transport security of every Kafka client (librdkafka's ``security.protocol``, ``ssl.*``
    and ``sasl.*``; ``adapters/kafka_io.py`` :func:`kafka_config`)."""

    protocol: KafkaProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    """Required by the ``SASL_*`` protocols."""
    sasl_username: str | None = None
    """User of ``PLAIN`` and ``SCRAM-*``."""
    sasl_password: SecretStr | None = None
    """Password of ``PLAIN`` and ``SCRAM-*`` (environment only)."""
    oauth_token_url: str | None = None
    """``OAUTHBEARER``: the OIDC token endpoint librdkafka asks for a token (client
    credentials grant)."""
    oauth_client_id: str | None = None
    oauth_client_secret: SecretStr | None = None
    """``OAUTHBEARER`` client secret (environment only)."""
    oauth_scope: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _coherent(self) -> KafkaSecurity:
        if self.tls_files and not self.tls:
            raise ValueError(f"TLS files with protocol {self.protocol}: use SSL or SASL_SSL")
        password = (self.sasl_username, self.sasl_password)
        oauth = (self.oauth_token_url, self.oauth_client_id, self.oauth_client_secret)
        given = [v for v in (self.sasl_mechanism, *password, *oauth, self.oauth_scope)
                 if v is not None]
        if not self.sasl:
            if given:
                raise ValueError(f"SASL settings with protocol {self.protocol}: use "
                                 "SASL_SSL or SASL_PLAINTEXT")
            return self
        if self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs a sasl_mechanism")
        needed, unused = (oauth, password) if self.sasl_mechanism == "OAUTHBEARER" else (
            password, (*oauth, self.oauth_scope))
        if any(v is None for v in needed) or any(v is not None for v in unused):
            what = ("oauth_token_url, oauth_client_id and oauth_client_secret"
                    if self.sasl_mechanism == "OAUTHBEARER" else
                    "sasl_username and sasl_password")
            raise ValueError(f"SASL {self.sasl_mechanism} takes {what} (and only those)")
        return self


class ApiRedisTimeout(_Frozen):
    """How long the API waits for Redis (admission, idempotency fences), per lane, before it
    takes Redis for down (a second of fallbacks: local admission for P0/P1, 503 for P2/P3,
    fences by transaction)."""

    all: timedelta = timedelta(milliseconds=250)
    priority: timedelta = timedelta(milliseconds=150)
    """P0 asks Redis twice before Kafka (admission, fence): a Redis slower than this is
    down for P0's purposes (its SLA is 1 s)."""
    bulk: timedelta = timedelta(milliseconds=250)

    def of(self, lane: str) -> timedelta:
        return {"priority": self.priority, "bulk": self.bulk}.get(lane, self.all)


class ApiTls(_Frozen):
    """HTTPS on the API, optionally with client certificates (mutual TLS). Off while
    ``cert_file`` is unset. Client certificates are checked at the handshake only; who the
    caller is still comes from its bearer token."""

    cert_file: Path | None = None
    """PEM certificate chain of the API (its leaf first)."""
    key_file: Path | None = None
    """PEM private key of ``cert_file`` (unencrypted: mount it from a secret)."""
    client_ca_file: Path | None = None
    """PEM bundle of the CA(s) whose client certificates are accepted."""
    client_certs: Literal["none", "optional", "required"] = "none"
    """Whether a client must present a certificate signed by ``client_ca_file``."""

    @model_validator(mode="after")
    def _coherent(self) -> ApiTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("api_tls.cert_file and api_tls.key_file go together")
        if self.client_certs != "none" and (self.client_ca_file is None
                                            or self.cert_file is None):
            raise ValueError("api_tls.client_certs needs api_tls.cert_file and "
                             "api_tls.client_ca_file")
        return self


class CassandraSecurity(TlsFiles):
    """TLS and password authentication of the Cassandra driver (``ssl_context``,
    ``PlainTextAuthProvider``; ``adapters/cassandra_store.py`` :func:`connect`)."""

    tls: bool = False
    """Connect with TLS (``client_encryption_options`` enabled on the nodes)."""
    username: str | None = None
    password: SecretStr | None = None
    """The role's password (environment only)."""

    @model_validator(mode="after")
    def _coherent(self) -> CassandraSecurity:
        if self.tls_files and not self.tls:
            raise ValueError("Cassandra TLS files without tls = true")
        if (self.username is None) != (self.password is None):
            raise ValueError("Cassandra username and password go together")
        return self


class RedisSecurity(TlsFiles):
    """TLS files and ACL credentials of every Redis client (``adapters/redis_pool.py``
    :func:`redis_client`); TLS itself is chosen by the URL (``rediss://``,
    ``rediss+sentinel://``)."""

    username: str | None = None
    """ACL user; None: the default user."""
    password: SecretStr | None = None
    """Password of ``username`` (or of the default user); environment only. A password in
    ``redis_url`` wins."""

    @model_validator(mode="after")
    def _coherent(self) -> RedisSecurity:
        if self.username is not None and self.password is None:
            raise ValueError("Redis username without password")
        return self


TRANSPORT_SECURITY = ("kafka_security", "cassandra_security", "redis_security")
"""Settings whose secrets come from the environment only (never from ``NOTIFLOW_CONFIG``)."""


def _secret_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, f in model.model_fields.items()
                     if SecretStr in (f.annotation, *get_args(f.annotation)))


class _ConfigFile(TomlConfigSettingsSource):
    """The ``NOTIFLOW_CONFIG`` file; refuses transport secrets in it (environment only)."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: Path) -> None:
        super().__init__(settings_cls, toml_file=toml_file)
        for section in TRANSPORT_SECURITY:
            model = settings_cls.model_fields[section].annotation
            given = self.toml_data.get(section)
            if isinstance(given, dict) and isinstance(model, type) and issubclass(
                    model, BaseModel):
                found = sorted(_secret_fields(model) & given.keys())
                if found:
                    raise SettingsError(
                        f"{toml_file}: {section}.{found[0]} is a secret: set it in the "
                        f"environment (NOTIFLOW_{section.upper()}__{found[0].upper()})")


class Settings(BaseSettings):
    """Runtime configuration shared by every notiflow process."""

    model_config = SettingsConfigDict(
        env_prefix="NOTIFLOW_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,
    )

    environment: Literal["development", "production"] = "production"
    """``development``: the local stack and the emulators (``notiflow.devenv``), where
    provider endpoints may be plain ``http`` anywhere and the API serves its docs;
    ``production``: provider endpoints are ``https`` (plain ``http`` only to a loopback
    address) and the docs are off unless ``api_docs`` turns them on."""
    api_docs: bool | None = None
    """Serve ``/docs``, ``/redoc`` and ``/openapi.json``; None: in development only."""

    # infrastructure (loopback, non-default ports)
    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_replication_factor: int = Field(1, ge=1, le=16)
    """Replicas of each topic notiflow creates (3 on a cluster: one broker may die)."""
    kafka_min_insync_replicas: int = Field(1, ge=1, le=16)
    """Replicas holding a record before ``acks=all`` acknowledges it, per topic (2 of 3 on a
    cluster); at most ``kafka_replication_factor``."""
    kafka_security: KafkaSecurity = KafkaSecurity()
    """TLS and SASL of every Kafka client (docs/operations.md, "Transport security")."""
    kafka_controller_port: int = 19093
    kafka_proxied_port: int = 19094
    """A third listener of the local stack's brokers, which advertises ``kafka_proxy_port``:
    a client that bootstraps there keeps every connection on that proxy (``notiflow chaos``
    puts toxiproxy on it; nothing listens there otherwise)."""
    kafka_proxy_port: int = 19095
    topic_prefix: str = ""
    ingest_partitions: int = Field(4, ge=1, le=256)
    events_partitions: int = Field(4, ge=1, le=256)
    cassandra_hosts: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 19042
    cassandra_storage_port: int = 17000
    cassandra_jmx_port: int = 17199
    cassandra_keyspace: str = Field("notiflow", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    cassandra_replication: dict[str, int] = Field(
        default_factory=lambda: {"datacenter1": 1}, min_length=1)
    """Replicas of the keyspace per data centre (``NetworkTopologyStrategy``), e.g.
    ``{"dc1": 3, "dc2": 3}``; the local stack's one node is ``datacenter1``."""
    cassandra_local_dc: str | None = None
    """The data centre this process talks to (the driver's ``DCAwareRoundRobinPolicy``; LOCAL_*
    consistency counts its replicas); None = the first of ``cassandra_replication``."""
    cassandra_security: CassandraSecurity = CassandraSecurity()
    """TLS and authentication of the Cassandra driver (docs/operations.md, "Transport
    security")."""
    cassandra_read_keys: int = Field(32, ge=1, le=256)
    """Keys per ``IN`` read of the reconciler (adapters/cassandra_coalesce.py)."""
    cassandra_batch_rows: int = Field(64, ge=1, le=1000)
    """Rows per unlogged batch of the reconciler; about 2 KiB a message's eight rows: keep
    rows x size under Cassandra's ``batch_size_fail_threshold`` (50 KiB by default)."""
    api_coalesce: bool = True
    """The API's message-row and settle writes of concurrent requests share unlogged
    batches (``cassandra_batch_rows`` rows), its head reads ``IN`` queries; a failed batch
    fails every request it carried (each is undone and answered 503). It halves a batch
    item's CPU in the API and in Cassandra (``notiflow bench api``;
    docs/decisions/2026-12-04-acceptance-path-cpu.md)."""
    api_settle_interval: timedelta = timedelta(milliseconds=10)
    """The API answers ``202`` once Kafka acknowledged; the settles (key ``ACCEPTED``, outbox
    row removed) queued during this interval are written together, off the response path
    (``gateway/settler.py``)."""
    api_fence: bool = True
    """A request with an ``Idempotency-Key`` takes the key's fence in Redis and writes its
    reservation plainly; off (or Redis unavailable): a Cassandra lightweight transaction per
    key (``adapters/idempotency_fence.py``, docs/api.md "Idempotency")."""
    api_redis_timeout: ApiRedisTimeout = ApiRedisTimeout()
    api_fence_ttl: timedelta = timedelta(seconds=60)
    """How long a fence outlives its ``SET``: longer than a reservation takes to be written."""
    api_batch_concurrency: int = Field(128, ge=1)
    """Batch items in acceptance at once in one API process, all batches together; the rest
    wait their turn. Bounds the event loop's queue, so that Redis and Kafka timeouts measure
    the stores, not the process's own backlog (per batch, concurrent batches filled the loop
    until fence calls timed out and every key fell back to a lightweight transaction)."""
    redis_url: str = "redis://127.0.0.1:16379/0"
    """``redis://host:port/db``, or ``redis+sentinel://h1:port,h2:port/service[/db]`` for the
    primary Redis Sentinel names (docs/operations.md, "Replication and consistency");
    ``rediss://`` and ``rediss+sentinel://`` for TLS."""
    redis_security: RedisSecurity = RedisSecurity()
    """TLS files and credentials of every Redis client (docs/operations.md, "Transport
    security")."""
    redis_port: int = 16379

    # local stack
    stack_dir: Path = Path(".stack")
    cache_dir: Path = Path.home() / ".cache" / "notiflow"
    kafka_version: str = "4.1.1"
    cassandra_version: str = "5.0.6"
    kafka_heap_mb: int = 384
    cassandra_heap_mb: int = 1024
    jvm_gc_realtime: int = Field(1, ge=0, le=99)
    """Real-time priority (``SCHED_RR``) ``notiflow stack up`` gives the local JVMs'
    stop-the-world collector threads (0: leave them at the normal priority). Every thread of
    a JVM waits while they run, so a pause lasts as long as they wait for a core (see
    ``ops/stack.py`` :func:`prioritise_collector`)."""
    java_home: Path | None = None

    # processes
    api_host: str = "127.0.0.1"
    api_port: int = 18080
    audit_p0_interval: timedelta = timedelta(minutes=1)
    """How often an API process writes its ``p0.use`` audit rows (P0 acceptances per tenant
    since the last ones)."""
    api_tls: ApiTls = ApiTls()
    """HTTPS and optional mutual TLS on the API (off: plain HTTP, e.g. behind a TLS
    terminating load balancer)."""
    api_lane: Literal["all", "priority", "bulk"] = "all"
    """Which requests this API process serves: ``all``; ``priority``: sends of priority-lane
    tiers (P0, P1), templates, recipients, reads; ``bulk``: sends of bulk-lane tiers (P2,
    P3), provider webhooks, the same reads, at the CPU niceness of the bulk lane's tiers.
    A send of the other lane's tier gets ``421 wrong_lane`` (docs/api.md, "Lanes")."""
    api_server: ServerLimits = ServerLimits()
    """What one API process takes at once (uvicorn's ``limit_concurrency``, ``backlog``,
    ``timeout_keep_alive``; a bound on a request's head)."""
    api_processes: int = Field(1, ge=1, le=64)
    """Worker processes of one ``notiflow api`` (``--processes``), sharing its socket under
    a supervisor. One process runs Python on about one core at most (the GIL): on a host
    with spare cores, one per core the API may use (docs/api.md, "Processes")."""
    fakes_host: str = "127.0.0.1"
    fakes_port: int = 18090
    flow_epoch_seconds: int = Field(5, ge=1)
    """Bytewax epoch length: offsets and state are committed to the recovery store at every
    epoch's end, and the worker stands still meanwhile (SQLite writes and fsyncs, racing
    every other writer of the disk). At 2 s the P0 flow's commits were a P0 stall every
    other second under the flood (``kafka`` stage, p99 489 ms; at 5 s 175 ms,
    docs/decisions/2026-12-02-p0-epoch-length.md); a longer epoch widens what a crashed flow
    re-reads,
    which the dedup leases make harmless. A tier's ``epoch`` overrides it for its send
    flow (P0: 30 s)."""
    reconcile_nice: int = Field(10, ge=0, le=19)
    bulk_yield: YieldRule = Field(default_factory=YieldRule)
    """How bulk work yields to P0's latency (docs/architecture.md, "Reservation")."""
    recovery_partitions: int = Field(4, ge=1)
    """Partitions of a flow's recovery store, fixed when the store is created: the most
    processes a flow's cluster can have."""
    cluster_settle_seconds: float = Field(20.0, ge=0)
    """A flow started with ``--peers-dns`` starts once its cluster's member count has held
    this long (``adapters/cluster_peers.py``)."""
    cluster_watch_seconds: float = Field(10.0, gt=0)
    """How often a member found in DNS re-counts its cluster (a change seen twice in a row
    restarts it)."""
    campaigns: CampaignRule = Field(default_factory=CampaignRule)
    """How campaigns expand and yield."""
    scheduling: SchedulingRule = Field(default_factory=SchedulingRule)
    """Where future P2/P3 work waits and how schedulers release it."""
    kafka_window: OutageWindow = Field(default_factory=OutageWindow)
    """What the API accepts while Kafka does not acknowledge."""
    object_store: ObjectStoreSettings = Field(default_factory=ObjectStoreSettings)
    """How ``s3://`` URIs are reached; the local stack's SeaweedFS (docs/operations.md)."""
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    """The history archive (docs/operations.md, "History archive")."""

    # policy
    tiers: dict[Tier, TierPolicy] = Field(default_factory=lambda: dict(DEFAULT_TIERS))
    time_scale: float = Field(1.0, gt=0)
    content_dedup_window: timedelta = timedelta(minutes=10)
    operational_ttl: timedelta = timedelta(days=30)
    idempotency_ttl: timedelta = timedelta(hours=24)
    outbox_sweep_after: timedelta = timedelta(seconds=30)
    max_variables_bytes: int = 16_384
    ordering_max_waiting: int = Field(1000, ge=1, le=1_000_000)
    """Messages one ``ordering_key`` holds in the send flow behind its head (a retry, a
    breaker wait); one more ends FAILED ``ordering_backlog`` (``flows/ordering.py``)."""

    # capacity and pressure (docs/design.md, "Caps and rate limits")
    mode: Literal["tiered", "shared"] = "tiered"
    """``shared``: one ingest topic, one flow, one worker pool for all tiers (benchmark
    baseline only)."""
    provider_rates: dict[str, float] = Field(
        default_factory=lambda: {"twilio": 1000.0, "vonage": 500.0, "sendgrid": 1000.0,
                                 "smtp": 200.0, "ses": 200.0, "fcm": 10_000.0,
                                 "apns": 10_000.0, "slack": 500.0, "teams": 500.0,
                                 "inbox": 5000.0})
    """Contracted requests/s per provider account."""
    tier_shares: dict[Tier, float] = Field(default_factory=lambda: dict(DEFAULT_SHARES))
    p0_emergency_rate: float = Field(0.0, ge=0)
    """Requests/s P0 may use beyond its reservation (an emergency quota)."""
    local_rate_fraction: float = Field(0.5, gt=0, le=1)
    """Share of a tier's reservation it may use on local limits while Redis is down."""
    caps: dict[Category, CapRule] = Field(default_factory=lambda: dict(DEFAULT_CAPS))
    default_quiet_hours: QuietHours = QuietHours()
    strong_consent_categories: frozenset[Category] = frozenset({Category.MARKETING})
    """Categories whose opt-out is re-checked in Cassandra at send (strong consistency)."""
    unknown_resolution: timedelta = timedelta(minutes=15)
    """How long an ambiguous attempt may wait for a receipt before it ends FAILED."""
    receipt_park_for: timedelta = timedelta(minutes=15)
    """How long a receipt for an unknown provider message id is retried before the DLQ."""
    retry_share: float = Field(0.25, gt=0, le=1)
    """Share of a channel's in-flight sends that retries may use (new traffic keeps the rest)."""

    # tenants and providers
    tenants: tuple[TenantConfig, ...] = ()
    jwt: JwtAuth = JwtAuth()
    """OAuth2 client-credentials JWTs (off by default: static tokens)."""
    twilio: TwilioSettings = TwilioSettings()
    sendgrid: SendGridSettings = SendGridSettings()
    ses: SesSettings = SesSettings()
    fcm: FcmSettings = FcmSettings()
    vonage: VonageSettings = VonageSettings()
    smtp: SmtpSettings = SmtpSettings()
    apns: ApnsSettings = ApnsSettings()
    slack: SlackSettings = SlackSettings()
    teams: TeamsSettings = TeamsSettings()
    inbox: InboxSettings = InboxSettings()
    routes: tuple[ProviderRoute, ...] = DEFAULT_ROUTES
    breaker: BreakerRule = BreakerRule()
    """Circuit breakers per provider account (``notiflow.adapters.breaker``)."""
    fakes_smtp_port: int = 18025
    fakes_ses_access_key_id: str | None = None
    fakes_ses_secret_access_key: SecretStr | None = None
    """The key pair the SES emulator accepts (besides ``ses``'s own, when configured)."""
    fakes_ses_sns_endpoint_url: str | None = None
    """Where the SES emulator's SNS topic delivers SES events (the API's ``/webhooks/ses``);
    unset: it publishes none."""
    fakes_apns_port: int = 18443
    fakes_apns_cert_file: Path | None = None
    """PEM certificate chain of the APNs emulator's TLS listener (a throw-away test CA's;
    ``notiflow.devenv`` writes one). Unset: the APNs emulator does not listen."""
    fakes_apns_key_file: Path | None = None
    """PEM private key of that certificate."""

    provider_webhook_max_age: timedelta = timedelta(minutes=5)
    """Oldest (and furthest future) signed timestamp a provider webhook may carry (SendGrid,
    Vonage); older posts are refused as replays. Wall-clock, not scaled by ``time_scale``."""
    client_webhooks: ClientWebhookRule = ClientWebhookRule()
    egress: EgressSettings = EgressSettings()
    """Where tenant-supplied URLs may lead (docs/webhooks.md, "Allowed URLs")."""
    dlq: DlqRule = DlqRule()
    render_limits: RenderLimits = RenderLimits()
    """The budget of every template render (``NOTIFLOW_RENDER_LIMITS__CPU_TIME`` ...)."""
    category_tiers: CategoryTiers = CategoryTiers()
    """Tiers each message category may use (``NOTIFLOW_CATEGORY_TIERS__ALLOWED``, JSON)."""
    ingest_encryption: IngestEncryption = IngestEncryption()
    ingest_binding: IngestBinding = IngestBinding()
    telemetry: TelemetrySettings = TelemetrySettings()
    log_format: Literal["text", "json"] = "text"
    """Log lines: ``text`` for a terminal, ``json`` one event per line with trace and message
    ids (``NOTIFLOW_LOG_FORMAT``)."""

    # secrets
    dlq_key: SecretStr | None = None
    correlation_key: SecretStr | None = None
    """Key of the tags that make SMTP bounce addresses and campaign message ids unforgeable
    (``notiflow/correlation.py``); ``new,old`` during a rotation. Unset: derived from
    ``dlq_key``."""
    recipient_hash_key: SecretStr | None = None
    """Key of the pseudonymous recipient hashes (HMAC-SHA-256, ``notiflow/redact.py``) stored
    in Cassandra, Kafka keys, Redis keys and the archive; ``new,old`` during a rotation (the
    first hashes, every one is looked up). Unset: derived from ``dlq_key``."""
    recipient_hash_legacy: bool = False
    """Also look recipients up by the unkeyed SHA-256 hash of earlier releases (a migration
    window, docs/operations.md, "Recipient hashes"); off by default."""
    secrets_dir: Path | None = None
    """A directory of files named like ``NOTIFLOW_*`` environment variables, one value each
    (a mounted Kubernetes Secret), read as the environment is and winning over it. Set
    through the environment (``NOTIFLOW_SECRETS_DIR``); a missing directory is an error.
    Processes re-read it every ``secrets_poll`` and take changed tenants and provider
    accounts without a restart (``notiflow/secrets.py``, docs/operations.md)."""
    secrets_poll: timedelta = timedelta(seconds=10)
    """How often a process looks for a change in ``secrets_dir``."""
    secrets_rotation_window: timedelta = timedelta(hours=1)
    """How long a replaced tenant token or provider webhook secret is still accepted after a
    reload (old and new both valid); what the process itself signs or sends uses the new
    one at once."""

    @field_validator("secrets_poll")
    @classmethod
    def _positive_poll(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("secrets_poll must be positive")
        return v

    @field_validator("content_dedup_window")
    @classmethod
    def _dedup_window_bounds(cls, v: timedelta) -> timedelta:
        if not timedelta(minutes=10) <= v <= timedelta(hours=24):
            raise ValueError("content_dedup_window must be between 10 minutes and 24 hours")
        return v

    @model_validator(mode="after")
    def _complete_tiers(self) -> Settings:
        missing = set(Tier) - set(self.tiers)
        if missing:
            merged = dict(DEFAULT_TIERS)
            merged.update(self.tiers)
            object.__setattr__(self, "tiers", merged)
        ids = [t.id for t in self.tenants]
        if len(ids) != len(set(ids)):
            raise ValueError("tenant ids must be unique")
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError("kafka_min_insync_replicas exceeds kafka_replication_factor")
        if self.redis_security.tls_files and not self.redis_url.startswith("rediss"):
            raise ValueError("redis_security has TLS files but redis_url is not rediss:// "
                             "or rediss+sentinel://")
        for dc, rf in self.cassandra_replication.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", dc) or not 1 <= rf <= 16:
                raise ValueError(f"cassandra_replication: {dc!r}: {rf} is not a data centre "
                                 "name with 1-16 replicas")
        if self.cassandra_local_dc is not None and (
                self.cassandra_local_dc not in self.cassandra_replication):
            raise ValueError(f"cassandra_local_dc {self.cassandra_local_dc!r} is not a data "
                             f"centre of cassandra_replication "
                             f"({', '.join(self.cassandra_replication)})")
        if self.environment != "development":
            for name, url in self.provider_endpoints():
                if insecure_endpoint(url):
                    raise ValueError(f"{name}: plain http to a host other than loopback is "
                                     "allowed in development only (environment)")
        return self

    def provider_endpoints(self) -> list[tuple[str, str]]:
        """(setting, URL) of every endpoint the platform sends credentials or messages to:
        provider APIs, chat webhook prefixes, the identity provider's keys."""
        found = [("twilio.base_url", self.twilio.base_url),
                 ("sendgrid.base_url", self.sendgrid.base_url),
                 ("ses.endpoint_url", self.ses.endpoint_url),
                 ("fcm.base_url", self.fcm.base_url), ("fcm.token_uri", self.fcm.token_uri),
                 ("vonage.base_url", self.vonage.base_url),
                 ("apns.base_url", self.apns.base_url)]
        found += [("slack.webhook_prefixes", p) for p in self.slack.webhook_prefixes]
        found += [("teams.webhook_prefixes", p) for p in self.teams.webhook_prefixes]
        if self.jwt.jwks_url:
            found.append(("jwt.jwks_url", self.jwt.jwks_url))
        return found

    @property
    def serves_api_docs(self) -> bool:
        """Whether the API serves its docs and OpenAPI document (``api_docs``)."""
        return self.environment == "development" if self.api_docs is None else self.api_docs

    @property
    def cassandra_dc(self) -> str:
        """The driver's local data centre: ``cassandra_local_dc`` or the first replicated."""
        return self.cassandra_local_dc or next(iter(self.cassandra_replication))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        secrets_dir = os.environ.get("NOTIFLOW_SECRETS_DIR")
        if secrets_dir:
            sources.insert(1, NestedSecretsSettingsSource(
                file_secret_settings, secrets_dir=secrets_dir, secrets_dir_missing="error",
                secrets_prefix="NOTIFLOW_", secrets_nested_delimiter="__"))
        config_file = os.environ.get("NOTIFLOW_CONFIG")
        if config_file:
            sources.append(_ConfigFile(settings_cls, Path(config_file)))
        return tuple(sources)

    # derived helpers -------------------------------------------------------------------

    def scaled(self, d: timedelta) -> timedelta:
        """A policy duration multiplied by ``time_scale`` (docs/design.md, "Time, retention and
        scale")."""
        return d * self.time_scale

    def policy(self, tier: Tier) -> TierPolicy:
        return self.tiers[tier]

    def lane_tiers(self, lane: str) -> frozenset[Tier]:
        """The tiers of ``lane`` (``all``: every tier)."""
        return frozenset(t for t, p in self.tiers.items() if lane in ("all", p.lane))

    def lane_nice(self, lane: str) -> int:
        """CPU niceness of a lane's shared processes: the least of its tiers' (0 for all)."""
        return 0 if lane == "all" else min(
            (self.tiers[t].nice for t in self.lane_tiers(lane)), default=0)

    def lane_realtime(self, lane: str) -> int:
        """Real-time priority of a lane's shared processes: the highest of its tiers' (0 for
        all: one process serving every tier stays in the normal scheduler)."""
        return 0 if lane == "all" else max(
            (self.tiers[t].realtime for t in self.lane_tiers(lane)), default=0)

    def tier_ttl(self, tier: Tier) -> timedelta:
        return self.scaled(self.tiers[tier].ttl)

    def share(self, tier: Tier) -> float:
        return self.tier_shares.get(tier, DEFAULT_SHARES[tier])

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def ingest_topic(self, channel: Channel, tier: Tier) -> str:
        """Where an accepted message of (channel, tier) goes; one topic for all in shared
        mode."""
        if self.mode == "shared":
            return self.shared_topic
        return self.topic(f"ingest.{Channel(channel).value.lower()}.{Tier(tier).value.lower()}")

    @property
    def shared_topic(self) -> str:
        return self.topic("ingest.shared")

    @property
    def webhooks_dlq_topic(self) -> str:
        return self.topic("notify.dlq.webhooks")

    def dlq_topic(self, tier: Tier | None) -> str:
        name = f"notify.dlq.{Tier(tier).value.lower()}" if tier else "notify.dlq.reconcile"
        return self.topic(name)

    @property
    def events_topic(self) -> str:
        return self.topic("notify.events")

    @property
    def delayed_topic(self) -> str:
        """Retries that wait ``scheduling.long_wait`` or more, on their way to a bucket."""
        return self.topic("notify.delayed")

    @property
    def receipts_topic(self) -> str:
        return self.topic("notify.receipts")

    @property
    def preferences_topic(self) -> str:
        return self.topic("notify.preferences")

    def tenant_by_token(self, token: str) -> TenantConfig | None:
        """The tenant whose token this is (constant-time compare of the UTF-8 bytes: a header
        with non-ASCII characters is a wrong token, not an error)."""
        import hmac

        given = token.encode(errors="surrogateescape")
        for tenant in self.tenants:
            if tenant.token is not None and hmac.compare_digest(
                    tenant.token.get_secret_value().encode(), given):
                return tenant
        return None

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        return _tenant_index(self.tenants).get(tenant_id)

    def enabled_providers(self) -> frozenset[str]:
        """Provider accounts whose credentials are configured (the router's candidates)."""
        def present(secret: SecretStr | None) -> bool:
            return secret is not None and bool(secret.get_secret_value())

        enabled = set()
        if present(self.twilio.auth_token):
            enabled.add(self.twilio.provider_id)
        if self.vonage.api_key and present(self.vonage.api_secret):
            enabled.add(self.vonage.provider_id)
        if present(self.sendgrid.api_key):
            enabled.add(self.sendgrid.provider_id)
        if self.smtp.username is not None and present(self.smtp.password):
            enabled.add(self.smtp.provider_id)
        if self.ses.access_key_id and present(self.ses.secret_access_key):
            enabled.add(self.ses.provider_id)
        if self.fcm.client_email and present(self.fcm.private_key):
            enabled.add(self.fcm.provider_id)
        if self.apns.team_id and self.apns.key_id and present(self.apns.private_key):
            enabled.add(self.apns.provider_id)
        for chat in (self.slack, self.teams):
            if chat.enabled and chat.webhook_prefixes:
                enabled.add(chat.provider_id)
        if self.inbox.enabled:
            enabled.add(self.inbox.provider_id)
        return frozenset(enabled)

    def webhook_prefixes(self) -> dict[str, tuple[str, ...]]:
        """Chat provider id → the webhook URL prefixes it serves."""
        return {c.provider_id: c.webhook_prefixes for c in (self.slack, self.teams)}

    def pace(self, provider_id: str) -> PaceRule | None:
        """The per-webhook pace of a chat provider; None for every other provider."""
        for chat in (self.slack, self.teams):
            if chat.provider_id == provider_id:
                return chat.pace
        return None

    def enabled_channels(self) -> frozenset[Channel]:
        """Channels with at least one configured provider; others are refused at admission."""
        enabled = self.enabled_providers()
        return frozenset(r.channel for r in self.routes if r.provider_id in enabled)


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


def load_settings(**overrides: Any) -> Settings:
    """Build the settings object once per process (overrides win over env and file)."""
    return Settings(**overrides)


_TENANT_INDEXES: dict[int, tuple[tuple[TenantConfig, ...], dict[str, TenantConfig]]] = {}


def _tenant_index(tenants: tuple[TenantConfig, ...]) -> dict[str, TenantConfig]:
    """``tenants`` by id, the first of a duplicated id winning; built once per tuple (the
    dispatcher looks a tenant up per message, and scanning the list was 2 % of its CPU)."""
    hit = _TENANT_INDEXES.get(id(tenants))
    if hit is not None and hit[0] is tenants:
        return hit[1]
    if len(_TENANT_INDEXES) >= 64:
        _TENANT_INDEXES.clear()
    index = {t.id: t for t in reversed(tenants)}
    _TENANT_INDEXES[id(tenants)] = (tenants, index)
    return index
