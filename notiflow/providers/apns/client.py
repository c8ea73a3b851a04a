"""Apple Push Notification service (APNs) adapter, on Apple's real HTTP/2 wire format.

``POST {base_url}/3/device/{device_token}`` over HTTP/2 with TLS, token-based authentication:
``authorization: bearer <provider token>``, a JWT signed ES256 with the team's APNs key
(header ``{"alg": "ES256", "kid": key_id}``, claims ``{"iss": team_id, "iat": now}``). Apple
rejects a token older than one hour (403 ``ExpiredProviderToken``) and one refreshed more often
than every 20 minutes (429 ``TooManyProviderTokenUpdates``);
:class:`~notiflow.providers.apns.tokens.ProviderTokens` signs one, hands it out for
``refresh_after`` (45 minutes by default) and re-signs early only after an
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
...}`` (``timestamp`` too on 410) mapped by the tables of
:mod:`~notiflow.providers.apns.classify`, transport failures too;
``docs/providers.md`` explains each row.
Only ``ios`` recipients go to APNs. The HTTP/2 client is ``pyreqwest`` (measured in
``notiflow/bench/http2_clients.py``); it stays behind this adapter.
"""


from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

import orjson
from pyreqwest.client import Client, ClientBuilder

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    ProviderBase,
    Rule,
    masked,
    retry_wait,
    seconds,
    utcnow,
)
from notiflow.providers.apns.classify import (
    EXPIRED_PROVIDER_TOKEN,
    REASONS,
    classify_exception,
    classify_response,
    reason_of,
    transport_code,
)
from notiflow.providers.apns.config import ApnsSettings
from notiflow.providers.apns.tokens import DEFAULT_TOKEN_REFRESH, ProviderTokens
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.settings import DEFAULT_TIERS, Settings

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES: Final = 4096
MAX_COLLAPSE_ID_BYTES: Final = 64
APNS_ID_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "urn:notiflow:apns-id")
HIGH_PRIORITY_TIERS: Final = frozenset({Tier.P0, Tier.P1})
PLATFORMS: Final = frozenset({PushPlatform.IOS})
BACKSTOP_S: Final = 1.0
"""Grace after a request's own deadline before the event loop abandons waiting for it."""

_T = Outcome.TRANSIENT


def apns_id(message: OutboundMessage) -> str:
    """The ``apns-id`` of one attempt: a UUIDv5 of ``message_id:attempt`` (stable across
    resends of the same attempt, different per attempt)."""
    return str(uuid.uuid5(APNS_ID_NAMESPACE, message.idempotency_key))



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
        recipient = self._push_target(message, started, PLATFORMS)
        if isinstance(recipient, SendResult):
            return recipient
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
            return self._result(rule, message, started, error_code=reason or f"http_{status}",
                                retry_after_s=retry_wait(rule, retry_after))

    def _account_label(self) -> str:
        return (f"key {self._config.key_id} of team {self._config.team_id} "
                f"(topic {self._config.topic})")

    async def aclose(self) -> None:
        """Close the HTTP/2 connection."""
        await self._client.close()
