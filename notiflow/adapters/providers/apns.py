"""Apple Push Notification service (APNs) adapter, on Apple's real HTTP/2 wire format.

``POST {base_url}/3/device/{device_token}`` over HTTP/2 with TLS, token-based authentication:
``authorization: bearer <provider token>``, a JWT signed ES256 with the team's APNs key
(header ``{"alg": "ES256", "kid": key_id}``, claims ``{"iss": team_id, "iat": now}``). Apple
rejects a token older than one hour (403 ``ExpiredProviderToken``) and one refreshed more often
than every 20 minutes (429 ``TooManyProviderTokenUpdates``); :class:`ProviderTokens` signs one,
hands it out for ``refresh_after`` (45 minutes by default) and re-signs early only after an
``ExpiredProviderToken``, at most once per 20 minutes.

Request headers: ``apns-topic`` (the bundle id), ``apns-push-type: alert``, ``apns-priority``
(10 for P0/P1, 5 for P2/P3), ``apns-expiration`` (0 for P0: deliver now or never; otherwise
send time + the tier's TTL, an upper bound of the message's remaining life because
:class:`~notiflow.adapters.providers.base.OutboundMessage` carries no expiry), ``apns-id`` (a
UUIDv5 of ``message_id:attempt``; APNs echoes it but does not deduplicate on it, so it is a
correlation id, not an idempotency key) and ``apns-collapse-id`` = ``message_id`` (a resent
duplicate replaces the earlier notification on the device instead of showing twice). Body
``{"aps": {"alert": {"title", "body"}}, "message_id", "attempt"}``, at most 4096 bytes.

A 200 is the acceptance; its ``apns-id`` is the provider message id. Errors are ``{"reason":
...}`` (``timestamp`` too on 410) mapped by :data:`REASONS`, then :data:`HTTP_STATUSES`,
:data:`STATUS_CLASSES`, and :data:`CONNECT_PHASE_ERRORS` / :data:`TRANSPORT_ERRORS` for
transport failures; ``docs/providers.md`` explains each row.
Only ``ios`` recipients go to APNs. The HTTP/2 client is ``pyreqwest`` (measured in
``notiflow/bench/http2_clients.py``); it stays behind this adapter.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pyreqwest import exceptions as rq
from pyreqwest.client import Client, ClientBuilder

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    INVALID_RECIPIENT,
    ProviderBase,
    Rule,
    masked,
    parse_retry_after,
    seconds,
    utcnow,
)
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import DEFAULT_TIERS, ApnsSettings, Settings

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES: Final = 4096
MAX_COLLAPSE_ID_BYTES: Final = 64
TOKEN_MAX_AGE: Final = timedelta(hours=1)
"""APNs refuses a provider token whose ``iat`` is older than this."""
TOKEN_MIN_REFRESH: Final = timedelta(minutes=20)
"""APNs refuses a new provider token sooner than this after the previous one."""
DEFAULT_TOKEN_REFRESH: Final = timedelta(minutes=45)
APNS_ID_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "urn:notiflow:apns-id")
HIGH_PRIORITY_TIERS: Final = frozenset({Tier.P0, Tier.P1})
PLATFORMS: Final = frozenset({PushPlatform.IOS})

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

REASONS: Final[Mapping[str, Rule]] = {
    # the device token
    "BadDeviceToken": Rule(_P, "invalid_recipient", deactivate=True),
    "Unregistered": Rule(_P, "unregistered", deactivate=True),
    "ExpiredToken": Rule(_P, "unregistered", deactivate=True),
    "DeviceTokenNotForTopic": Rule(_P, "token_not_for_topic"),
    "MissingDeviceToken": Rule(_P, "invalid_recipient"),
    # the content, or headers derived from this message
    "PayloadEmpty": Rule(_P, "invalid_content"),
    "PayloadTooLarge": Rule(_P, "invalid_content"),
    "BadCollapseId": Rule(_P, "rejected"),
    "BadExpirationDate": Rule(_P, "rejected"),
    # our configuration or our wire format: every message would fail alike
    "BadTopic": Rule(_T, "misconfigured"),
    "MissingTopic": Rule(_T, "misconfigured"),
    "TopicDisallowed": Rule(_T, "misconfigured"),
    "BadMessageId": Rule(_T, "misconfigured"),
    "BadPriority": Rule(_T, "misconfigured"),
    "DuplicateHeaders": Rule(_T, "misconfigured"),
    "InvalidPushType": Rule(_T, "misconfigured"),
    "BadPath": Rule(_T, "misconfigured"),
    "MethodNotAllowed": Rule(_T, "misconfigured"),
    "Forbidden": Rule(_T, "misconfigured"),
    "UnrelatedKeyIdInToken": Rule(_T, "misconfigured"),
    # credentials (ExpiredProviderToken is first refreshed and retried once)
    "ExpiredProviderToken": Rule(_T, "auth_failed"),
    "InvalidProviderToken": Rule(_T, "auth_failed"),
    "MissingProviderToken": Rule(_T, "auth_failed"),
    "BadCertificate": Rule(_T, "auth_failed"),
    "BadCertificateEnvironment": Rule(_T, "auth_failed"),
    "TooManyProviderTokenUpdates": Rule(_T, "auth_failed"),
    # throttling and Apple-side trouble
    "TooManyRequests": Rule(_T, "rate_limited"),
    "IdleTimeout": Rule(_T, "connection_lost"),
    "InternalServerError": Rule(_A, "server_error"),
    "ServiceUnavailable": Rule(_T, "server_error"),
    "Shutdown": Rule(_T, "server_error"),
}
"""APNs ``reason`` → rule; consulted first. Unknown reasons fall through to the status."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = {
    400: Rule(_P, "rejected"),
    403: Rule(_T, "auth_failed"),
    404: Rule(_T, "misconfigured"),
    405: Rule(_T, "misconfigured"),
    410: Rule(_P, "unregistered", deactivate=True),
    413: Rule(_P, "invalid_content"),
    429: Rule(_T, "rate_limited"),
    500: Rule(_A, "server_error"),
    502: Rule(_T, "server_error"),
    503: Rule(_T, "server_error"),
    504: Rule(_A, "gateway_timeout"),
}
"""HTTP status → rule, for answers without a known ``reason``."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "unexpected_status"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort (a 2xx other than 200 is AMBIGUOUS)."""

CONNECT_PHASE: Final = "client error (Connect)"
"""The cause hyper reports for a failure while setting up the connection (TCP, TLS, ALPN)."""

CONNECT_PHASE_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (rq.ConnectTimeoutError, Rule(_T, "connect_timeout")),
    (rq.ConnectError, Rule(_T, "connect_error")),
)
"""Exception type → rule when the cause chain names :data:`CONNECT_PHASE`: nothing was sent.
``pyreqwest`` raises the same types for a connection that broke or timed out after the
request went out; those fall through to :data:`TRANSPORT_ERRORS`."""

TRANSPORT_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (rq.PoolTimeoutError, Rule(_T, "connect_timeout")),
    (rq.BuilderError, Rule(_T, "misconfigured")),
    (TimeoutError, Rule(_A, "timeout")),
    (rq.ConnectError, Rule(_A, "connection_lost")),
    (rq.ReadError, Rule(_A, "connection_lost")),
    (rq.WriteError, Rule(_A, "connection_lost")),
    (rq.RequestError, Rule(_A, "transport_error")),
    (Exception, Rule(_A, "client_error")),
)
"""Exception type → rule for everything else, first ``isinstance`` match wins: waiting for a
free stream slot and building the request happen before sending (TRANSIENT); a timeout or a
broken connection after that may have been processed (AMBIGUOUS)."""

BACKSTOP_S: Final = 1.0
"""Grace after a request's own deadline before the event loop abandons waiting for it."""
NO_PROVIDER_FOR_PLATFORM: Final = Rule(_T, "no_provider_for_platform")
EXPIRED_PROVIDER_TOKEN: Final = "ExpiredProviderToken"


def classify_response(status: int, reason: str | None) -> Rule:
    """The rule for a non-success answer: APNs reason, then HTTP status, then status class."""
    if reason is not None and (rule := REASONS.get(reason)) is not None:
        return rule
    rule = HTTP_STATUSES.get(status)
    if rule is not None:
        return rule
    return STATUS_CLASSES.get(status // 100, Rule(_A, "unexpected_status"))


def in_connect_phase(exc: BaseException) -> bool:
    """Whether a ``pyreqwest`` error happened while connecting (its causes name
    :data:`CONNECT_PHASE`)."""
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    return any(isinstance(c, dict) and c.get("message") == CONNECT_PHASE for c in causes or ())


def classify_exception(exc: BaseException) -> Rule:
    """The rule for a transport failure (:data:`CONNECT_PHASE_ERRORS`, then
    :data:`TRANSPORT_ERRORS`)."""
    if in_connect_phase(exc):
        for kind, rule in CONNECT_PHASE_ERRORS:
            if isinstance(exc, kind):
                return rule
    for kind, rule in TRANSPORT_ERRORS:
        if isinstance(exc, kind):
            return rule
    return Rule(_A, "client_error")


def transport_code(exc: BaseException) -> str:
    """``error_code`` of a transport failure: the exception class name, with ``:sent`` when
    ``pyreqwest`` named a connect error or timeout that happened after the connect phase."""
    name = type(exc).__name__
    connect_kind = isinstance(exc, rq.ConnectError | rq.ConnectTimeoutError)
    return f"{name}:sent" if connect_kind and not in_connect_phase(exc) else name


def reason_of(raw: bytes) -> str | None:
    """The ``reason`` of an APNs error body; None when absent or not JSON."""
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    reason = payload.get("reason") if isinstance(payload, dict) else None
    return reason if isinstance(reason, str) and reason else None


def apns_id(message: OutboundMessage) -> str:
    """The ``apns-id`` of one attempt: a UUIDv5 of ``message_id:attempt`` (stable across
    resends of the same attempt, different per attempt)."""
    return str(uuid.uuid5(APNS_ID_NAMESPACE, message.idempotency_key))


# provider token (ES256 JWT) -----------------------------------------------------------------


def load_signing_key(pem: str) -> ec.EllipticCurvePrivateKey:
    """The APNs signing key (.p8 PEM); ``ValueError`` unless it is an EC P-256 private key."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (TypeError, ValueError) as exc:
        raise ValueError("apns.private_key is not a PEM private key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve,
                                                                         ec.SECP256R1):
        raise ValueError("apns.private_key is not an EC P-256 key")
    return key


def provider_token(team_id: str, key_id: str, key: ec.EllipticCurvePrivateKey,
                   now: datetime) -> str:
    """The provider token issued at ``now``: header exactly ``{"alg": "ES256", "kid"}`` (no
    ``typ``), claims ``{"iss", "iat"}``, signature the raw 64-byte ``r || s`` of RFC 7518."""
    return jwt.encode({"iss": team_id, "iat": int(now.timestamp())}, key, algorithm="ES256",
                      headers={"kid": key_id, "typ": None})


@dataclass(frozen=True, slots=True)
class IssuedToken:
    value: str
    issued_at: datetime


class ProviderTokens:
    """The provider token of one APNs key, signed locally and cached.

    ``current`` returns the cached token until it is ``refresh_after`` old (20 minutes ≤
    ``refresh_after`` < 60 minutes), then signs a new one. ``expired(value)`` is called after
    APNs answered ``ExpiredProviderToken`` for ``value``: if ``value`` is still the cached token
    and no early refresh happened in the last 20 minutes, the next ``current`` signs a new
    token; it returns whether a retry with ``current`` can help.
    """

    def __init__(self, team_id: str, key_id: str, key: ec.EllipticCurvePrivateKey, *,
                 clock: Callable[[], datetime] = utcnow,
                 refresh_after: timedelta = DEFAULT_TOKEN_REFRESH) -> None:
        if not TOKEN_MIN_REFRESH <= refresh_after < TOKEN_MAX_AGE:
            raise ValueError("refresh_after must be at least 20 and under 60 minutes")
        self.team_id = team_id
        self.key_id = key_id
        self._key = key
        self._clock = clock
        self.refresh_after = refresh_after
        self._token: IssuedToken | None = None
        self._forced_at: datetime | None = None
        self.signed = 0
        """Tokens signed (for tests and metrics)."""

    @classmethod
    def from_settings(cls, config: ApnsSettings, *, clock: Callable[[], datetime] = utcnow,
                      refresh_after: timedelta = DEFAULT_TOKEN_REFRESH) -> ProviderTokens:
        """The configured key; ``ValueError`` when team id, key id or key are missing or
        the key is not EC P-256."""
        if not config.team_id or not config.key_id or config.private_key is None:
            raise ValueError("apns.team_id, apns.key_id and apns.private_key are not configured")
        return cls(config.team_id, config.key_id,
                   load_signing_key(config.private_key.get_secret_value()), clock=clock,
                   refresh_after=refresh_after)

    @property
    def cached(self) -> IssuedToken | None:
        return self._token

    def current(self) -> str:
        """A provider token younger than ``refresh_after`` (signed now if needed)."""
        token = self._token
        now = self._clock()
        if token is None or now - token.issued_at >= self.refresh_after:
            token = IssuedToken(provider_token(self.team_id, self.key_id, self._key, now), now)
            self._token = token
            self.signed += 1
        return token.value

    def expired(self, value: str) -> bool:
        """APNs called ``value`` expired: drop it if it is the cached token and no early
        refresh happened in the last 20 minutes. True when ``current`` now differs from
        ``value`` (a retry is worthwhile)."""
        token = self._token
        if token is None or token.value != value:
            return True
        now = self._clock()
        if self._forced_at is not None and now - self._forced_at < TOKEN_MIN_REFRESH:
            return False
        self._forced_at = now
        self._token = None
        return True


# the adapter --------------------------------------------------------------------------------


def _tier_ttls(settings: Settings | ApnsSettings) -> dict[Tier, timedelta]:
    if isinstance(settings, Settings):
        return {tier: settings.tier_ttl(tier) for tier in Tier}
    return {tier: policy.ttl for tier, policy in DEFAULT_TIERS.items()}


class ApnsPush(ProviderBase):
    """One APNs key and app (topic) as a
    :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Build it with :meth:`open` inside the event loop that will use it. All sends share one
    HTTP/2 connection (streams multiplexed; the client opens more only if the server limits
    concurrent streams). ``send`` never raises for provider answers or transport failures; its
    timeout bounds the whole call, the one retry after ``ExpiredProviderToken`` included.
    """

    channel = Channel.PUSH
    name = "apns"
    log = log

    def __init__(self, config: ApnsSettings, client: Client, *, timeout: float,
                 tokens: ProviderTokens, ttls: Mapping[Tier, timedelta],
                 clock: Callable[[], datetime] = utcnow) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.provider_id = config.provider_id
        self._config = config
        self._client = client
        self._timeout = timeout
        self._clock = clock
        self._ttls = dict(ttls)
        self._base = config.base_url.rstrip("/")
        self.tokens = tokens
        self._last_warned: dict[str, float] = {}

    @classmethod
    async def open(cls, settings: Settings | ApnsSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_in_flight: int = 1000,
                   clock: Callable[[], datetime] = utcnow,
                   token_refresh: timedelta = DEFAULT_TOKEN_REFRESH) -> ApnsPush:
        """Open an HTTP/2 client bound to the running loop.

        ``timeout`` bounds each ``send`` as a whole; connection set-up (TCP, TLS, ALPN ``h2``)
        gets ``connect_timeout`` (default half of ``timeout``). ``max_in_flight`` caps
        concurrent requests. ``apns.ca_file`` (a PEM CA certificate) is trusted in addition to
        the system roots. ``apns-expiration`` uses the tier TTLs of ``settings`` (the defaults
        when given only the APNs section). Raises ``ValueError`` when ``apns.team_id``,
        ``apns.key_id`` or ``apns.private_key`` are missing or the key is not EC P-256, and
        ``OSError`` when ``ca_file`` cannot be read. No connection is made here.
        """
        config = settings.apns if isinstance(settings, Settings) else settings
        tokens = ProviderTokens.from_settings(config, clock=clock, refresh_after=token_refresh)
        total = seconds(timeout)
        if total <= 0:
            raise ValueError("timeout must be positive")
        connect = total / 2 if connect_timeout is None else seconds(connect_timeout)
        builder = (ClientBuilder()
                   .http2_prior_knowledge()
                   .connect_timeout(timedelta(seconds=connect))
                   .pool_timeout(timedelta(seconds=connect))
                   .max_connections(max_in_flight)
                   .follow_redirects(False)
                   .gzip(False).brotli(False).zstd(False).deflate(False)
                   .user_agent("notiflow-apns/1")
                   .http2_keep_alive_interval(timedelta(seconds=60))
                   .http2_keep_alive_while_idle(True))
        if config.ca_file:
            builder = builder.add_root_certificate_pem(Path(config.ca_file).read_bytes())
        client = builder.build()
        return cls(config, client, timeout=total, tokens=tokens, ttls=_tier_ttls(settings),
                   clock=clock)

    def payload(self, message: OutboundMessage) -> bytes:
        """The request body APNs receives for ``message``."""
        alert: dict[str, str] = {"body": message.body}
        if message.subject:
            alert["title"] = message.subject
        return orjson.dumps({"aps": {"alert": alert}, "message_id": message.message_id,
                             "attempt": message.attempt})

    def headers(self, message: OutboundMessage, now: datetime) -> dict[str, str]:
        """The request headers of ``message`` sent at ``now``, all but ``authorization``."""
        if message.tier is Tier.P0:
            expiration = 0
        else:
            ttl = self._ttls.get(message.tier, DEFAULT_TIERS[message.tier].ttl)
            expiration = int((now + ttl).timestamp())
        headers = {
            "apns-topic": self._config.topic,
            "apns-push-type": "alert",
            "apns-priority": "10" if message.tier in HIGH_PRIORITY_TIERS else "5",
            "apns-expiration": str(expiration),
            "apns-id": apns_id(message),
            "content-type": "application/json",
        }
        if len(message.message_id.encode()) <= MAX_COLLAPSE_ID_BYTES:
            headers["apns-collapse-id"] = message.message_id
        return headers

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        """Send one push message; ``timeout`` overrides the one given to :meth:`open`."""
        started = self._clock()
        recipient = message.recipient
        if not isinstance(recipient, PushRecipient):
            return self._result(INVALID_RECIPIENT, message, started)
        if recipient.platform not in PLATFORMS:
            return self._result(NO_PROVIDER_FOR_PLATFORM, message, started,
                                error_code=recipient.platform.value)
        data = self.payload(message)
        if len(data) > MAX_PAYLOAD_BYTES:
            return self._result(REASONS["PayloadTooLarge"], message, started,
                                error_code="PayloadTooLarge")
        total = self._timeout if timeout is None else seconds(timeout)
        deadline = time.monotonic() + total
        url = f"{self._base}/3/device/{recipient.device_token}"
        headers = self.headers(message, started)
        retried = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._result(Rule(_T, "timeout"), message, started,
                                    error_code="deadline_before_send")
            token = self.tokens.current()
            try:
                request = (self._client.post(url)
                           .headers(headers)
                           .header("authorization", f"bearer {token}", is_sensitive=True)
                           .body_bytes(data)
                           .timeout(timedelta(seconds=remaining))
                           .build())
                async with asyncio.timeout(remaining + BACKSTOP_S):
                    response = await request.send()
                    raw = bytes(await response.bytes())
                status = response.status
                echoed = response.get_header("apns-id")
                retry_after = response.get_header("retry-after")
            except Exception as exc:
                rule = classify_exception(exc)
                if rule.reason == "client_error":
                    log.exception("apns send of %s attempt %d to %s failed unexpectedly",
                                  message.message_id, message.attempt, masked(recipient))
                return self._result(rule, message, started, error_code=transport_code(exc))
            if status == 200:
                return self._accepted(started, echoed or headers["apns-id"])
            reason = reason_of(raw)
            if reason == EXPIRED_PROVIDER_TOKEN and not retried and self.tokens.expired(token):
                retried = True
                continue
            rule = classify_response(status, reason)
            wait = parse_retry_after(retry_after) if rule.outcome is Outcome.TRANSIENT else None
            return self._result(rule, message, started, error_code=reason or f"http_{status}",
                                retry_after_s=wait)

    def _account_label(self) -> str:
        return (f"key {self._config.key_id} of team {self._config.team_id} "
                f"(topic {self._config.topic})")

    async def aclose(self) -> None:
        """Close the HTTP/2 connection."""
        await self._client.close()
