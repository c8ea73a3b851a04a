"""Calling services (``NOTIFLOW_TENANTS``): each tenant's credentials and what it may send,
the senders its messages may name, and how its status webhooks are delivered."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from datetime import timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from notiflow.schemas.enums import Channel, Tier
from notiflow.settings.section import _Frozen


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

    sms_help: str | None = Field(None, min_length=1, max_length=320)
    """What a HELP texted to one of the tenant's own numbers (``senders``) is answered with:
    the programme's name and how to reach support. None: the platform's text."""

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
