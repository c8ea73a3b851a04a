"""Firebase Cloud Messaging HTTP v1 (push) adapter, on Google's real wire format.

``POST {base_url}/v1/projects/{project_id}/messages:send`` with ``Authorization: Bearer
<OAuth2 access token>`` and ``{"message": {"token", "notification", "data", "android" |
"webpush"}}``. A 200 with ``{"name": "projects/{p}/messages/{id}"}`` is the acceptance.

The access token comes from the service account (:mod:`~notiflow.providers.fcm.tokens`).
A 401 on ``messages:send`` without an FCM error code (an expired or revoked token) refreshes the
token once and retries that request once: a 401 is answered before anything is sent.

Errors are Google JSON (``{"error": {"code", "message", "status", "details": [{"@type":
".../google.firebase.fcm.v1.FcmError", "errorCode"}]}}``) mapped by the tables of
:mod:`~notiflow.providers.fcm.classify` and the shared transport table;
``docs/providers.md`` explains each row. FCM has no idempotency key: a timeout after the request
was sent is AMBIGUOUS. Only ``android`` and ``web`` recipients go to FCM (the router sends
``ios`` to APNs); an ``ios`` recipient that reaches this adapter anyway is TRANSIENT
``no_provider_for_platform``, so it retries until it expires instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import orjson
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    HttpProvider,
    Rule,
    parse_json,
    parse_retry_after,
    retry_wait,
    seconds,
    utcnow,
)
from notiflow.providers.fcm.classify import (
    AUTH_UNAVAILABLE,
    STATUS_CLASSES,
    TOKEN_STATUSES,
    classify_response,
    error_of,
)
from notiflow.providers.fcm.config import FcmSettings
from notiflow.providers.fcm.tokens import (
    GRANT_TYPE,
    AccessTokens,
    ServiceAccount,
    TokenError,
)
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient

log = logging.getLogger(__name__)

PLATFORMS: Final = frozenset({PushPlatform.ANDROID, PushPlatform.WEB})
"""Platforms this adapter sends to; ``ios`` is routed to APNs."""
HIGH_PRIORITY_TIERS: Final = frozenset({Tier.P0, Tier.P1})

_T = Outcome.TRANSIENT


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
    def _headers(cls, config: FcmSettings) -> dict[str, str]:
        """No credentials (each request carries the access token); ``ValueError`` when the
        service account (``fcm.client_email``, ``fcm.private_key``) is not configured or the
        key is not an RSA PEM key. No token is fetched when opening: the first ``send`` does
        it, and its timeout bounds the whole call."""
        ServiceAccount.from_settings(config)
        return {"Accept": "application/json", "User-Agent": "notiflow-fcm/1"}

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
        target = self._push_target(message, started, PLATFORMS)
        if isinstance(target, SendResult):
            return target
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
            return self._result(rule, message, started,
                                error_code=code or canonical or f"http_{status}",
                                retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))

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
