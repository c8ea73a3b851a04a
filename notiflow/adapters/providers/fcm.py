"""Firebase Cloud Messaging HTTP v1 (push) adapter, on Google's real wire format.

``POST {base_url}/v1/projects/{project_id}/messages:send`` with ``Authorization: Bearer
<OAuth2 access token>`` and ``{"message": {"token", "notification", "data", "android" |
"webpush"}}``. A 200 with ``{"name": "projects/{p}/messages/{id}"}`` is the acceptance.

The access token comes from the service account: a JWT signed RS256 with its private key
(``iss`` = client_email, ``scope`` = firebase.messaging, ``aud`` = token_uri, at most one hour)
is exchanged at ``token_uri`` (``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``).
:class:`AccessTokens` caches it until shortly before it expires; concurrent sends share one
exchange. A 401 on ``messages:send`` without an FCM error code (an expired or revoked token)
refreshes the token once and retries that request once: a 401 is answered before anything is
sent.

Errors are Google JSON (``{"error": {"code", "message", "status", "details": [{"@type":
".../google.firebase.fcm.v1.FcmError", "errorCode"}]}}``) mapped by :data:`ERROR_CODES`, then
:data:`HTTP_STATUSES`, :data:`STATUS_CLASSES` and the transport table shared with the Twilio
adapter; ``docs/providers.md`` explains each row. FCM has no idempotency key: a timeout after
the request was sent is AMBIGUOUS. Only ``android`` and ``web`` recipients go to FCM (the
router sends ``ios`` to APNs); an ``ios`` recipient that reaches this adapter anyway is
TRANSIENT ``no_provider_for_platform``, so it retries until it expires instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    HTTP_DEFAULTS,
    INVALID_RECIPIENT,
    HttpProvider,
    Rule,
    parse_json,
    parse_retry_after,
    seconds,
    utcnow,
)
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import FcmSettings, Settings

log = logging.getLogger(__name__)

SCOPE: Final = "https://www.googleapis.com/auth/firebase.messaging"
GRANT_TYPE: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
FCM_ERROR_TYPE: Final = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
MAX_ASSERTION_LIFETIME: Final = timedelta(hours=1)
PLATFORMS: Final = frozenset({PushPlatform.ANDROID, PushPlatform.WEB})
"""Platforms this adapter sends to; ``ios`` is routed to APNs."""
HIGH_PRIORITY_TIERS: Final = frozenset({Tier.P0, Tier.P1})

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

ERROR_CODES: Final[Mapping[str, Rule]] = {
    "UNREGISTERED": Rule(_P, "unregistered", deactivate=True),
    "INVALID_ARGUMENT": Rule(_P, "rejected"),
    "SENDER_ID_MISMATCH": Rule(_P, "sender_id_mismatch"),
    "QUOTA_EXCEEDED": Rule(_T, "rate_limited"),
    "UNAVAILABLE": Rule(_T, "server_error"),
    "INTERNAL": Rule(_A, "server_error"),
    "THIRD_PARTY_AUTH_ERROR": Rule(_T, "misconfigured"),
}
"""FCM ``errorCode`` (the ``FcmError`` detail) → rule; consulted first. ``UNSPECIFIED_ERROR``
and unknown codes fall through to the HTTP status."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = HTTP_DEFAULTS
"""HTTP status → rule, for answers without a known FCM error code: 401 is a token FCM still
refuses after one refresh; 403 (PERMISSION_DENIED: the service account lacks the FCM role, or
the API is off) and 404 without ``UNREGISTERED`` (wrong project) are our configuration."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "malformed_response"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort. A 2xx without a message ``name`` is AMBIGUOUS."""

TOKEN_STATUSES: Final[Mapping[int, Rule]] = {
    400: Rule(_T, "auth_failed"),
    401: Rule(_T, "auth_failed"),
    403: Rule(_T, "auth_failed"),
}
"""Token endpoint status → rule (``invalid_grant``, ``invalid_client``, ...). Anything else that
is not a token — 429, 5xx, a transport failure, a timeout — is TRANSIENT ``auth_unavailable``:
no message was sent yet, so nothing about the token phase is ever AMBIGUOUS."""

AUTH_UNAVAILABLE: Final = Rule(_T, "auth_unavailable")
NO_PROVIDER_FOR_PLATFORM: Final = Rule(_T, "no_provider_for_platform")


def classify_response(status: int, error_code: str | None) -> Rule:
    """The rule for a non-success answer: FCM error code, then HTTP status, then status
    class."""
    if error_code is not None and (rule := ERROR_CODES.get(error_code)) is not None:
        return rule
    rule = HTTP_STATUSES.get(status)
    if rule is not None:
        return rule
    return STATUS_CLASSES.get(status // 100, Rule(_A, "unexpected_status"))


def error_of(payload: Any) -> tuple[str | None, str | None]:
    """(Google canonical ``status``, FCM ``errorCode``) of an error body; None where absent."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return None, None
    error = payload["error"]
    status = error.get("status") if isinstance(error.get("status"), str) else None
    code = None
    details = error.get("details")
    if isinstance(details, list):
        for detail in details:
            if (isinstance(detail, dict) and detail.get("@type") == FCM_ERROR_TYPE
                    and isinstance(detail.get("errorCode"), str)):
                code = detail["errorCode"]
                break
    return status, code


# service-account assertion (RS256 JWT) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """The parts of a Google service-account key the token exchange needs."""

    client_email: str
    private_key: rsa.RSAPrivateKey
    token_uri: str
    private_key_id: str | None = None

    @classmethod
    def from_settings(cls, config: FcmSettings) -> ServiceAccount:
        """The configured account; ``ValueError`` when incomplete or not an RSA key."""
        if not config.client_email or config.private_key is None:
            raise ValueError("fcm.client_email and fcm.private_key are not configured")
        key = serialization.load_pem_private_key(
            config.private_key.get_secret_value().encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("fcm.private_key is not an RSA private key")
        return cls(config.client_email, key, config.token_uri, config.private_key_id)


def assertion_claims(account: ServiceAccount, now: datetime, *,
                     lifetime: timedelta = MAX_ASSERTION_LIFETIME,
                     scope: str = SCOPE) -> dict[str, Any]:
    """The claims of a token-exchange assertion issued at ``now`` (lifetime capped at 1 h)."""
    iat = int(now.timestamp())
    span = int(min(lifetime, MAX_ASSERTION_LIFETIME).total_seconds())
    return {"iss": account.client_email, "scope": scope, "aud": account.token_uri,
            "iat": iat, "exp": iat + span}


def service_account_assertion(account: ServiceAccount, now: datetime, *,
                              lifetime: timedelta = MAX_ASSERTION_LIFETIME) -> str:
    """The JWT exchanged for an access token: RS256 over :func:`assertion_claims`, header
    ``{"alg": "RS256", "typ": "JWT"}`` plus ``kid`` = ``private_key_id`` when configured."""
    headers = {"kid": account.private_key_id} if account.private_key_id else None
    return jwt.encode(assertion_claims(account, now, lifetime=lifetime), account.private_key,
                      algorithm="RS256", headers=headers)


# access tokens ----------------------------------------------------------------------------


class TokenError(Exception):
    """The token endpoint gave no token; carries the classification of the failed send."""

    def __init__(self, rule: Rule, error_code: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{rule.reason} ({error_code})")
        self.rule = rule
        self.error_code = error_code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class AccessToken:
    value: str
    refresh_at: datetime
    """When the cache stops handing it out (shortly before it expires)."""


Exchange = Callable[[str, float], Awaitable[tuple[str, float]]]
"""(assertion, timeout seconds) → (access token, expires_in seconds); raises
:class:`TokenError` or a transport exception."""


class AccessTokens:
    """The cached OAuth2 access token of one service account.

    ``get`` returns the cached token until ``refresh_margin`` (at most a tenth of its lifetime)
    before it expires; then one exchange runs, shared by every concurrent caller. A failed
    exchange is raised to each waiting caller and is not cached. ``invalidate`` drops the token
    only if it is still the cached one, so concurrent 401s cause a single refresh.
    """

    def __init__(self, account: ServiceAccount, exchange: Exchange, *,
                 clock: Callable[[], datetime] = utcnow,
                 refresh_margin: timedelta = timedelta(minutes=5)) -> None:
        self.account = account
        self._exchange = exchange
        self._clock = clock
        self._margin = refresh_margin
        self._token: AccessToken | None = None
        self._pending: asyncio.Task[AccessToken] | None = None
        self.exchanges = 0
        """Exchanges started (for tests and metrics)."""

    @property
    def cached(self) -> AccessToken | None:
        return self._token

    async def get(self, timeout: float) -> str:
        """A valid access token, waiting at most ``timeout`` seconds for an exchange."""
        token = self._token
        if token is not None and self._clock() < token.refresh_at:
            return token.value
        task = self._pending
        if task is None:
            task = asyncio.get_running_loop().create_task(self._refresh(timeout))
            task.add_done_callback(self._settled)
            self._pending = task
        return (await asyncio.wait_for(asyncio.shield(task), timeout)).value

    def cancel(self) -> None:
        """Abandon an exchange in flight (the client is closing)."""
        if self._pending is not None:
            self._pending.cancel()

    def invalidate(self, value: str) -> None:
        """Forget ``value`` if it is the cached token (the provider refused it)."""
        if self._token is not None and self._token.value == value:
            self._token = None

    async def _refresh(self, timeout: float) -> AccessToken:
        self.exchanges += 1
        assertion = service_account_assertion(self.account, self._clock())
        value, expires_in = await self._exchange(assertion, timeout)
        margin = min(self._margin, timedelta(seconds=expires_in / 10))
        token = AccessToken(value, self._clock() + timedelta(seconds=expires_in) - margin)
        self._token = token
        return token

    def _settled(self, task: asyncio.Task[AccessToken]) -> None:
        if self._pending is task:
            self._pending = None
        if not task.cancelled():
            task.exception()


# the adapter ------------------------------------------------------------------------------


class FcmPush(HttpProvider[FcmSettings]):
    """One Firebase project (service account) as a
    :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Build it with :meth:`open` inside the event loop that will use it. ``send`` never raises
    for provider answers or transport failures; its timeout bounds the whole call, a token
    exchange and the one retry after a 401 included.
    """

    channel = Channel.PUSH
    name = "fcm"
    log = log

    def __init__(self, config: FcmSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow,
                 tokens: AccessTokens | None = None) -> None:
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(f"{config.base_url.rstrip('/')}/v1/projects/{config.project_id}"
                        "/messages:send")
        self._token_uri = URL(config.token_uri)
        self.tokens = tokens or AccessTokens(ServiceAccount.from_settings(config),
                                             self._exchange, clock=clock)

    @classmethod
    async def open(cls, settings: Settings | FcmSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 256,
                   clock: Callable[[], datetime] = utcnow) -> FcmPush:
        """Open a pooled client bound to the running loop.

        ``timeout`` bounds each ``send`` as a whole; each HTTP request's connection set-up gets
        ``connect_timeout`` (default half of ``timeout``). Raises ``ValueError`` when the
        service account (``fcm.client_email``, ``fcm.private_key``) is not configured or the
        key is not an RSA PEM key. No token is fetched here: the first ``send`` does it.
        """
        config = settings.fcm if isinstance(settings, Settings) else settings
        ServiceAccount.from_settings(config)
        headers = {"Accept": "application/json", "User-Agent": "notiflow-fcm/1"}
        return await cls._open(config, headers, timeout=timeout, connect_timeout=connect_timeout,
                               max_connections=max_connections, clock=clock)

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """The ``messages:send`` body FCM receives for ``message`` (a push recipient): the
        platform block carries the tier's priority (P0/P1 high, P2/P3 normal)."""
        recipient = message.recipient
        assert isinstance(recipient, PushRecipient)
        notification: dict[str, str] = {"body": message.body}
        if message.subject:
            notification["title"] = message.subject
        high = message.tier in HIGH_PRIORITY_TIERS
        body: dict[str, Any] = {
            "token": recipient.device_token,
            "notification": notification,
            "data": {"message_id": message.message_id, "attempt": str(message.attempt)},
        }
        if recipient.platform is PushPlatform.WEB:
            body["webpush"] = {"headers": {"Urgency": "high" if high else "normal"}}
        else:
            body["android"] = {"priority": "HIGH" if high else "NORMAL"}
        return {"message": body}

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
        total = self._timeout_s if timeout is None else seconds(timeout)
        connect = self._connect_timeout_s or total / 2
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total
        data = orjson.dumps(self.payload(message))
        refreshed = False
        while True:
            try:
                token = await self.tokens.get(max(deadline - loop.time(), 0.001))
            except TokenError as exc:
                return self._result(exc.rule, message, started, error_code=exc.error_code,
                                    retry_after_s=exc.retry_after_s)
            except Exception as exc:
                if not isinstance(exc, TimeoutError | aiohttp.ClientError):
                    log.exception("fcm token exchange failed unexpectedly")
                return self._result(AUTH_UNAVAILABLE, message, started,
                                    error_code=type(exc).__name__)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self._result(Rule(_T, "timeout"), message, started,
                                    error_code="deadline_before_send")
            limits = aiohttp.ClientTimeout(total=remaining, connect=min(connect, remaining))
            answer = await self._post(self._url, data, limits, message, started, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            if isinstance(answer, SendResult):
                return answer
            status, payload = answer.status, answer.json()
            if 200 <= status < 300:
                name = payload.get("name") if isinstance(payload, dict) else None
                if isinstance(name, str) and name:
                    return self._accepted(started, name)
                return self._result(STATUS_CLASSES[2], message, started,
                                    error_code=f"http_{status}")
            canonical, code = error_of(payload)
            if status == 401 and code is None and not refreshed:
                refreshed = True
                self.tokens.invalidate(token)
                continue
            rule = classify_response(status, code)
            wait = (parse_retry_after(answer.headers.get("Retry-After"))
                    if rule.outcome is Outcome.TRANSIENT else None)
            return self._result(rule, message, started,
                                error_code=code or canonical or f"http_{status}",
                                retry_after_s=wait)

    async def _exchange(self, assertion: str, timeout: float) -> tuple[str, float]:
        """Trade a signed assertion for (access token, expires_in) at ``token_uri``."""
        data = urlencode({"grant_type": GRANT_TYPE, "assertion": assertion}).encode()
        limits = aiohttp.ClientTimeout(total=timeout, connect=timeout / 2)
        try:
            async with self._session.post(
                    self._token_uri, data=data, timeout=limits, allow_redirects=False,
                    headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise TokenError(AUTH_UNAVAILABLE, type(exc).__name__) from exc
        payload = parse_json(raw)
        if status == 200 and isinstance(payload, dict):
            value, expires_in = payload.get("access_token"), payload.get("expires_in")
            if (isinstance(value, str) and value and isinstance(expires_in, int | float)
                    and not isinstance(expires_in, bool) and expires_in > 0):
                return value, float(expires_in)
        error = payload.get("error") if isinstance(payload, dict) else None
        code = error if isinstance(error, str) and error else f"http_{status}"
        rule = TOKEN_STATUSES.get(status, AUTH_UNAVAILABLE)
        if rule.reason == "auth_failed":
            described = payload.get("error_description") if isinstance(payload, dict) else None
            self._warn("auth_failed", f"{code}: {described}" if described else code)
        raise TokenError(rule, code, parse_retry_after(retry_after) if status == 429 else None)

    def _account_label(self) -> str:
        return f"project {self._config.project_id}"

    async def aclose(self) -> None:
        """Close the pooled connections (a pending token exchange is abandoned)."""
        self.tokens.cancel()
        await super().aclose()
