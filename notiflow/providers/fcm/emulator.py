"""Firebase Cloud Messaging HTTP v1 emulator, with Google's OAuth2 token endpoint
(``notiflow fakes``; dev, tests, benchmarks).

``POST /fcm/token`` stands in for ``https://oauth2.googleapis.com/token``: it takes the
jwt-bearer grant, verifies the assertion (:func:`verify_assertion`, with PyJWT rather than
adapter code) — its RS256 signature with the public half of the configured service-account key
(``fcm.private_key``; the emulator derives it), its ``iss``, ``aud`` (= ``fcm.token_uri``) and
``iat``/``exp`` — and issues an opaque access token with
``expires_in``. ``POST /fcm/v1/projects/{project}/messages:send`` checks that token and the
project, validates the message and answers on Google's wire format: ``{"name": ...}`` or
``{"error": {"code", "message", "status", "details": [FcmError]}}``. Latency, error mix, outages,
429 + Retry-After and accepted-then-hang are knobs over ``/_admin/fcm/config``; ``POST
/_admin/fcm/revoke-tokens`` invalidates every issued access token (the next send gets 401).
FCM has no delivery callbacks, so neither has the emulator. Every request to ``messages:send``
is recorded (the newest ``max_records``), device token included: test infrastructure only.

Magic device tokens (emulator only), by prefix: ``unregistered`` → 404 UNREGISTERED,
``invalid`` → 400 INVALID_ARGUMENT, ``mismatch`` → 403 SENDER_ID_MISMATCH, ``quota`` → 429
QUOTA_EXCEEDED, ``thirdpartyauth`` → 401 THIRD_PARTY_AUTH_ERROR.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

import jwt
import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import Field

from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Emulator,
    MessageRecord,
    json_response,
    retry_after_text,
)
from notiflow.providers.fcm.classify import FCM_ERROR_TYPE
from notiflow.providers.fcm.tokens import GRANT_TYPE, SCOPE
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/fcm"
TOKEN_PATH: Final = f"{PREFIX}/token"
SEND_PATH: Final = f"{PREFIX}/v1/projects/{{project_id}}/messages:send"
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
MAX_PAYLOAD_BYTES: Final = 4096
CLOCK_SKEW_S: Final = 300
MAX_ASSERTION_LIFETIME_S: Final = 3600
_FCM_TOKEN = re.compile(r"[A-Za-z0-9_:\-]{32,4096}")
_RESERVED_DATA_KEYS = frozenset({"from", "notification", "message_type"})

SHORT_LIVED: Final = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                      "reasonable timeframe. Check your iat and exp values in the JWT claim.")
BAD_SIGNATURE: Final = "Invalid JWT Signature."
UNKNOWN_ACCOUNT: Final = "Invalid grant: account not found"
BAD_AUDIENCE: Final = "Invalid JWT: Failed audience check."
MISSING_CREDENTIAL: Final = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, "
    "login cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project.")
INVALID_CREDENTIAL: Final = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project.")

MAGIC_TOKENS: Final[Mapping[str, tuple[int, str, str, str]]] = {
    "unregistered": (404, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found."),
    "invalid": (400, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                "The registration token is not a valid FCM registration token"),
    "mismatch": (403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"),
    "quota": (429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED",
              "Sending limit exceeded for the message target."),
    "thirdpartyauth": (401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR",
                       "Auth error from APNS or Web Push Service"),
}
"""Device-token prefix → (HTTP status, canonical status, FCM errorCode, message)."""


def google_error(code: int, status: str, message: str, *, fcm_error: str | None = None,
                 field: str | None = None) -> bytes:
    """Google's JSON error body, with an ``FcmError`` and/or ``BadRequest`` detail."""
    details: list[dict[str, Any]] = []
    if fcm_error is not None:
        details.append({"@type": FCM_ERROR_TYPE, "errorCode": fcm_error})
    if field is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"field": field, "description": message}]})
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return orjson.dumps({"error": error})


def oauth_error(error: str, description: str) -> bytes:
    """The token endpoint's error body."""
    return orjson.dumps({"error": error, "error_description": description})


class FcmKnobs(CommonKnobs):
    """Runtime behaviour of the FCM emulator (``outage`` and the error rates apply to
    ``messages:send``; the token endpoint has its own outage knob)."""

    token_outage: bool = False
    """The token endpoint answers 503."""
    token_ttl_s: int = Field(3599, ge=1, le=3600)
    """``expires_in`` of issued access tokens."""


@dataclass(slots=True)
class FcmRecord(MessageRecord):
    """One ``messages:send`` request; ``sid`` is the message name, ``to`` the device token,
    ``from`` the project in the path, ``body``/``title`` the notification."""

    title: str | None = None
    priority: str | None = None
    """``android.priority``, or ``webpush`` ``Urgency``."""
    error: str | None = None
    """FCM errorCode, else the canonical status, of a rejected request."""


@dataclass(frozen=True, slots=True)
class _Message:
    token: str | None
    title: str | None
    body: str | None
    priority: str | None
    message_id: str | None
    attempt: int | None


def _parse(payload: Any) -> _Message:
    message = payload.get("message") if isinstance(payload, dict) else None
    if not isinstance(message, dict):
        return _Message(None, None, None, None, None, None)
    token = message.get("token") if isinstance(message.get("token"), str) else None
    notification = message.get("notification")
    notification = notification if isinstance(notification, dict) else {}
    title = notification.get("title") if isinstance(notification.get("title"), str) else None
    body = notification.get("body") if isinstance(notification.get("body"), str) else None
    priority = None
    android = message.get("android")
    if isinstance(android, dict) and isinstance(android.get("priority"), str):
        priority = android["priority"]
    webpush = message.get("webpush")
    if isinstance(webpush, dict) and isinstance(webpush.get("headers"), dict):
        urgency = webpush["headers"].get("Urgency")
        priority = urgency if isinstance(urgency, str) else priority
    data = message.get("data")
    data = data if isinstance(data, dict) else {}
    message_id = data.get("message_id") if isinstance(data.get("message_id"), str) else None
    attempt = data.get("attempt")
    return _Message(token, title, body, priority, message_id,
                    int(attempt) if isinstance(attempt, str) and attempt.isdigit() else None)


def _validate(payload: Any) -> bytes | None:
    """The 400 body for an invalid ``messages:send`` request, None when valid."""
    message = payload.get("message") if isinstance(payload, dict) else None
    if not isinstance(message, dict):
        return google_error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.",
                            field="message")
    token = message.get("token")
    if token is None and "topic" not in message and "condition" not in message:
        return google_error(400, "INVALID_ARGUMENT", "Recipient of the message is not set.",
                            fcm_error="INVALID_ARGUMENT")
    if not isinstance(token, str) or not _FCM_TOKEN.fullmatch(token):
        return google_error(400, "INVALID_ARGUMENT",
                            "The registration token is not a valid FCM registration token",
                            fcm_error="INVALID_ARGUMENT")
    data = message.get("data", {})
    if not isinstance(data, dict):
        return google_error(400, "INVALID_ARGUMENT", "Invalid value at 'message.data'",
                            field="message.data")
    for i, (key, value) in enumerate(data.items()):
        if not isinstance(value, str):
            text = f"Invalid value at 'message.data[{i}].value' (TYPE_STRING), {value}"
            return google_error(400, "INVALID_ARGUMENT", text,
                                field=f"message.data[{i}].value")
        if key in _RESERVED_DATA_KEYS or key.startswith(("google", "gcm")):
            return google_error(400, "INVALID_ARGUMENT", f"Invalid data payload key: {key}",
                                fcm_error="INVALID_ARGUMENT")
    android = message.get("android")
    if isinstance(android, dict) and android.get("priority") not in (None, "HIGH", "NORMAL",
                                                                      "high", "normal"):
        text = (f"Invalid value at 'message.android.priority' "
                f"(type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), "
                f"\"{android.get('priority')}\"")
        return google_error(400, "INVALID_ARGUMENT", text, field="message.android.priority")
    size = len(orjson.dumps(data)) + len(orjson.dumps(message.get("notification", {})))
    if size > MAX_PAYLOAD_BYTES:
        return google_error(400, "INVALID_ARGUMENT", "Message is too big",
                            fcm_error="INVALID_ARGUMENT")
    return None


def _public_key(settings: Settings) -> rsa.RSAPublicKey | None:
    config = settings.fcm
    if config.private_key is None or not config.client_email:
        return None
    key = serialization.load_pem_private_key(config.private_key.get_secret_value().encode(),
                                             password=None)
    return key.public_key() if isinstance(key, rsa.RSAPrivateKey) else None


class GrantRefused(Exception):
    """The token endpoint refuses the assertion: 400 ``invalid_grant`` with ``description``."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


def verify_assertion(assertion: str, key: rsa.RSAPublicKey | None, *, issuer: str | None,
                     audience: str, now: float | None = None) -> dict[str, Any]:
    """The claims of a jwt-bearer assertion the token endpoint accepts, else
    :class:`GrantRefused` with Google's description. In this order: the unverified ``iss`` must
    name the account whose public key is ``key``; PyJWT verifies the RS256 signature, ``iss``
    and ``aud`` (exactly ``audience``); then ``iat`` and ``exp`` must be integers with ``iat <
    exp <= iat + 1 h``, ``exp > now`` and ``iat <= now +`` :data:`CLOCK_SKEW_S` (PyJWT has no
    lifetime limit). The scope is left to the caller."""
    try:
        segment = assertion.split(".")[1]
        unverified = orjson.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (IndexError, ValueError) as exc:
        raise GrantRefused(BAD_SIGNATURE) from exc
    if not isinstance(unverified, dict) or key is None or unverified.get("iss") != issuer:
        raise GrantRefused(UNKNOWN_ACCOUNT)
    try:
        claims: dict[str, Any] = jwt.decode(
            assertion, key, algorithms=["RS256"], audience=audience, issuer=issuer,
            options={"strict_aud": True, "verify_exp": False, "verify_iat": False,
                     "verify_nbf": False, "verify_sub": False, "verify_jti": False})
    except jwt.InvalidAudienceError as exc:
        raise GrantRefused(BAD_AUDIENCE) from exc
    except jwt.MissingRequiredClaimError as exc:
        raise GrantRefused(BAD_AUDIENCE if exc.claim == "aud" else UNKNOWN_ACCOUNT) from exc
    except jwt.InvalidIssuerError as exc:
        raise GrantRefused(UNKNOWN_ACCOUNT) from exc
    except jwt.InvalidTokenError as exc:
        raise GrantRefused(BAD_SIGNATURE) from exc
    iat, exp = claims.get("iat"), claims.get("exp")
    now = time.time() if now is None else now
    if (not isinstance(iat, int) or not isinstance(exp, int) or exp <= iat
            or exp - iat > MAX_ASSERTION_LIFETIME_S or exp <= now or iat > now + CLOCK_SKEW_S):
        raise GrantRefused(SHORT_LIVED)
    return claims


@dataclass(frozen=True, slots=True)
class _Issued:
    expires_at: float
    """``time.monotonic`` seconds."""
    scopes: frozenset[str]


class FcmEmulator(Emulator[FcmKnobs]):
    """State and handlers of the FCM emulator (one project, one service account)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("fcm", FcmKnobs)
        config = settings.fcm
        self.project_id = config.project_id
        self.client_email = config.client_email
        self.token_uri = config.token_uri
        self._public_key = _public_key(settings)
        self._tokens: dict[str, _Issued] = {}
        self.token_counts: Counter[str] = Counter()
        self._unavailable = google_error(503, "UNAVAILABLE", "The service is currently "
                                         "unavailable.", fcm_error="UNAVAILABLE")
        self._internal = google_error(500, "INTERNAL", "Internal error encountered.",
                                      fcm_error="INTERNAL")
        self._quota = google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric "
                                   "'Send requests' and limit 'Send requests per minute'.",
                                   fcm_error="QUOTA_EXCEEDED")
        if self._public_key is None:
            log.warning("fcm emulator: no service account configured (NOTIFLOW_FCM__CLIENT_EMAIL"
                        ", NOTIFLOW_FCM__PRIVATE_KEY); every token request will be refused")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(TOKEN_PATH, self.token),
            web.post(SEND_PATH, self.send),
            web.post("/_admin/fcm/revoke-tokens", self.revoke_tokens),
            *self.admin_routes(),
        ]

    def reset(self) -> None:
        super().reset()
        self._tokens.clear()
        self.token_counts.clear()

    def extra_stats(self) -> dict[str, Any]:
        counts = self.token_counts
        return {"token": {"requests": counts["requests"], "issued": counts["issued"],
                          "rejected": counts["rejected"], "revoked": counts["revoked"],
                          "by_error": {k.removeprefix("error:"): v for k, v in counts.items()
                                       if k.startswith("error:")},
                          "live": len(self._tokens)}}

    async def revoke_tokens(self, _request: web.Request) -> web.Response:
        """Invalidate every issued access token (as a key rotation or revocation would)."""
        revoked = len(self._tokens)
        self._tokens.clear()
        self.token_counts["revoked"] += revoked
        return json_response(orjson.dumps({"revoked": revoked}), 200)

    # token endpoint ----------------------------------------------------------------------

    async def token(self, request: web.Request) -> web.Response:
        self.token_counts["requests"] += 1
        if self.knobs.token_outage:
            return self._token_refused(503, "temporarily_unavailable",
                                       "The service is currently unavailable.")
        try:
            form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        except UnicodeDecodeError:
            form = {}
        grant_type = form.get("grant_type", "")
        if grant_type != GRANT_TYPE:
            return self._token_refused(400, "unsupported_grant_type",
                                       f"Invalid grant_type: {grant_type}")
        assertion = form.get("assertion")
        if not assertion:
            return self._token_refused(400, "invalid_request",
                                       "Missing required parameter: assertion")
        try:
            claims = verify_assertion(assertion, self._public_key, issuer=self.client_email,
                                      audience=self.token_uri)
        except GrantRefused as refused:
            return self._token_refused(400, "invalid_grant", refused.description)
        scope = claims.get("scope")
        scopes = frozenset(scope.split()) if isinstance(scope, str) else frozenset()
        if not scopes:
            return self._token_refused(400, "invalid_scope",
                                       "Invalid OAuth scope or ID token audience provided.")
        ttl = self.knobs.token_ttl_s
        value = "ya29.c." + base64.urlsafe_b64encode(os.urandom(48)).rstrip(b"=").decode()
        mono = time.monotonic()
        self._tokens = {k: v for k, v in self._tokens.items() if v.expires_at > mono}
        self._tokens[value] = _Issued(mono + ttl, scopes)
        self.token_counts["issued"] += 1
        return json_response(orjson.dumps({"access_token": value, "expires_in": ttl,
                                           "token_type": "Bearer"}), 200)

    def _token_refused(self, status: int, error: str, description: str) -> web.Response:
        self.token_counts["rejected"] += 1
        self.token_counts[f"error:{error}"] += 1
        return json_response(oauth_error(error, description), status)

    # messages:send -----------------------------------------------------------------------

    def _authorized(self, header: str | None) -> bytes | None:
        """The error body for a missing/unknown/expired access token; None if it is valid."""
        if not header or not header.startswith("Bearer "):
            return google_error(401, "UNAUTHENTICATED", MISSING_CREDENTIAL)
        issued = self._tokens.get(header.removeprefix("Bearer ").strip())
        if issued is None or issued.expires_at <= time.monotonic():
            return google_error(401, "UNAUTHENTICATED", INVALID_CREDENTIAL)
        return None

    async def send(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            payload = None
        msg = _parse(payload)
        project = request.match_info["project_id"]

        def record(outcome: str, status: int, *, sid: str | None = None, hang: bool = False,
                   error: str | None = None) -> None:
            self.messages.add(FcmRecord(
                received_at, outcome, status, None, sid, msg.message_id, msg.attempt,
                msg.token, project, msg.body, hang, title=msg.title, priority=msg.priority,
                error=error))

        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503, error="UNAVAILABLE")
            return json_response(self._unavailable, 503)
        refused = self._authorized(request.headers.get("Authorization"))
        if refused is not None:
            record("unauthorized", 401, error="UNAUTHENTICATED")
            return json_response(refused, 401,
                                 {"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'})
        token = request.headers["Authorization"].removeprefix("Bearer ").strip()
        if not self._tokens[token].scopes & {SCOPE, CLOUD_PLATFORM_SCOPE}:
            record("forbidden", 403, error="PERMISSION_DENIED")
            return json_response(google_error(403, "PERMISSION_DENIED", "Request had "
                                              "insufficient authentication scopes."), 403)
        if project != self.project_id:
            record("forbidden", 403, error="PERMISSION_DENIED")
            text = (f"Permission 'cloudmessaging.messages.create' denied on resource "
                    f"'//cloudresourcemanager.googleapis.com/projects/{project}' (or it may not "
                    "exist).")
            return json_response(google_error(403, "PERMISSION_DENIED", text), 403)
        if self.draw(knobs.error_rate_429):
            record("rate_limited", 429, error="QUOTA_EXCEEDED")
            return json_response(self._quota, 429,
                                 {"Retry-After": retry_after_text(knobs.retry_after_s)})
        if self.draw(knobs.error_rate_5xx):
            status: int = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status, error="INTERNAL" if status == 500 else "UNAVAILABLE")
            return json_response(self._internal if status == 500 else self._unavailable, status)
        invalid = _validate(payload)
        if invalid is not None:
            record("invalid", 400, error="INVALID_ARGUMENT")
            return json_response(invalid, 400)
        assert msg.token is not None
        magic = next((v for k, v in MAGIC_TOKENS.items() if msg.token.startswith(k)), None)
        if magic is not None:
            status, canonical, code, text = magic
            record("invalid" if status != 429 else "rate_limited", status, error=code)
            headers = ({"Retry-After": retry_after_text(knobs.retry_after_s)}
                       if status == 429 else None)
            return json_response(google_error(status, canonical, text, fcm_error=code), status,
                                 headers)
        name = (f"projects/{self.project_id}/messages/0:{int(received_at * 1000)}"
                f"%{secrets.token_hex(8)}")
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, sid=name, hang=hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return json_response(orjson.dumps({"name": name}), 200)
