"""Provider accounts (SMS, email, push, chat), what the router knows about each, their
circuit breakers, and which provider endpoints count as insecure outside development."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, model_validator

from notiflow.chat_hooks import parse_prefix
from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.settings.section import _Frozen


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
