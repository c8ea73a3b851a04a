"""SendGrid v3 Mail Send (email) adapter, on SendGrid's real wire format.

``POST {base_url}/v3/mail/send`` with ``Authorization: Bearer <API key>`` and a JSON body: one
personalization addressed to the recipient, ``from``, ``subject``, one ``text/plain`` content
block and ``custom_args`` carrying ``message_id`` and ``attempt``. SendGrid answers ``202`` with
an empty body and the ``X-Message-Id`` header: that is the provider's acceptance.

Every other answer, and every transport failure, is mapped to an :class:`Outcome` through the
data tables below (:data:`FIELD_RULES`, :data:`HTTP_STATUSES`, :data:`STATUS_CLASSES`, and the
transport table shared with the Twilio adapter); ``docs/providers.md`` explains each row.
SendGrid has no idempotency key for Mail Send: a timeout after the request was sent is AMBIGUOUS
and cannot be settled by resending with a key. SendGrid echoes ``custom_args`` as top-level keys
of every Event Webhook event, which is how a later ``processed`` / ``delivered`` event settles it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import aiohttp
import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    HttpAnswer,
    HttpProvider,
    Rule,
    parse_retry_after,
    utcnow,
)
from notiflow.schemas.enums import Channel
from notiflow.settings import SendGridSettings, Settings
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

MAIL_SEND_PATH: Final = "/v3/mail/send"
EVENT_SIGNATURE_HEADER: Final = "X-Twilio-Email-Event-Webhook-Signature"
EVENT_TIMESTAMP_HEADER: Final = "X-Twilio-Email-Event-Webhook-Timestamp"

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

FIELD_RULES: Final[tuple[tuple[re.Pattern[str], Rule], ...]] = (
    (re.compile(r"personalizations\.\d+\.(to|cc|bcc)\b"), Rule(_P, "invalid_recipient")),
    (re.compile(r"from\b"), Rule(_T, "misconfigured")),
    (re.compile(r"reply_to\b"), Rule(_T, "misconfigured")),
    (re.compile(r"(personalizations\.\d+\.)?subject\b"), Rule(_P, "invalid_content")),
    (re.compile(r"content\b"), Rule(_P, "invalid_content")),
)
"""``errors[].field`` of a 400 answer (matched from its start) → rule; consulted first. SendGrid
has no error codes: the field names what was wrong. The sender fields are our configuration,
never the message's fault, so they are TRANSIENT and win over any other field of the answer."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = {
    400: Rule(_P, "rejected"),
    401: Rule(_T, "auth_failed"),
    403: Rule(_T, "misconfigured"),
    404: Rule(_T, "misconfigured"),
    405: Rule(_T, "misconfigured"),
    406: Rule(_T, "misconfigured"),
    408: Rule(_T, "timeout"),
    413: Rule(_P, "invalid_content"),
    429: Rule(_T, "rate_limited"),
    451: Rule(_T, "misconfigured"),
    500: Rule(_A, "server_error"),
    502: Rule(_T, "server_error"),
    503: Rule(_T, "server_error"),
    504: Rule(_A, "gateway_timeout"),
}
"""HTTP status → rule, for answers no :data:`FIELD_RULES` row matched. 401 (bad API key) and
403 (key without the Mail Send scope, unverified sender identity, temporary block after too many
bad requests) are platform misconfiguration: TRANSIENT. A 500 may come after the mail was queued
(no idempotency key), so it is AMBIGUOUS like Twilio's; 502/503 never reached the mail queue."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "malformed_response"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort. A 2xx other than ``202`` + ``X-Message-Id`` is not
an acceptance we can trust (a proxy or a wrong base URL): AMBIGUOUS."""


def field_rule(field: str) -> Rule | None:
    """The :data:`FIELD_RULES` rule of one ``errors[].field``, if any."""
    for pattern, rule in FIELD_RULES:
        if pattern.match(field):
            return rule
    return None


def classify_response(status: int, fields: Sequence[str | None] = ()) -> Rule:
    """The rule for a non-success answer: error fields (400 only; a TRANSIENT field wins, else
    the first known one), then HTTP status, then status class."""
    if status == 400:
        rules = [r for f in fields if f and (r := field_rule(f)) is not None]
        for rule in rules:
            if rule.outcome is _T:
                return rule
        if rules:
            return rules[0]
    known = HTTP_STATUSES.get(status)
    if known is not None:
        return known
    return STATUS_CLASSES.get(status // 100, Rule(_A, "unexpected_status"))


def error_fields_of(payload: Any) -> list[str | None]:
    """The ``field`` of every entry of a SendGrid ``{"errors": [...]}`` body."""
    if not isinstance(payload, dict) or not isinstance(payload.get("errors"), list):
        return []
    fields: list[str | None] = []
    for entry in payload["errors"]:
        if isinstance(entry, dict):
            field = entry.get("field")
            fields.append(field if isinstance(field, str) else None)
    return fields


def rate_limit_wait(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds to wait after a 429: ``Retry-After`` if present, else ``X-RateLimit-Reset``
    (Unix seconds at which the window resets) minus now; None if neither parses. Never
    negative."""
    wait = parse_retry_after(headers.get("Retry-After"), now=now)
    if wait is not None:
        return wait
    reset = headers.get("X-RateLimit-Reset")
    if not reset:
        return None
    try:
        at = float(reset.strip())
    except ValueError:
        return None
    return max(at - (now or datetime.now(UTC)).timestamp(), 0.0)


def event_signature(key: ec.EllipticCurvePrivateKey, timestamp: str, payload: bytes) -> str:
    """``X-Twilio-Email-Event-Webhook-Signature`` of an Event Webhook post: base64 of the DER
    ECDSA P-256 / SHA-256 signature over the timestamp header followed by the raw body."""
    return base64.b64encode(
        key.sign(timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))).decode()


def load_event_public_key(text: str) -> ec.EllipticCurvePublicKey:
    """The verification key SendGrid shows: base64 DER SubjectPublicKeyInfo (PEM accepted)."""
    if "BEGIN PUBLIC KEY" in text:
        key = serialization.load_pem_public_key(text.encode())
    else:
        key = serialization.load_der_public_key(base64.b64decode(text))
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("the Event Webhook verification key is not an EC public key")
    return key


def verify_event_signature(public_key: ec.EllipticCurvePublicKey | str, payload: bytes,
                           signature: str | None, timestamp: str | None) -> bool:
    """True when ``signature`` is SendGrid's signature of ``timestamp`` + ``payload`` (the raw
    request body, byte for byte)."""
    if not signature or not timestamp:
        return False
    try:
        key = (load_event_public_key(public_key) if isinstance(public_key, str)
               else public_key)
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode() + payload,
                   ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


class SendGridEmail(HttpProvider[SendGridSettings]):
    """One SendGrid account as a :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Build it with :meth:`open` inside the event loop that will use it. ``send`` never raises
    for provider answers or transport failures; it bounds each call by the caller's timeout.
    """

    channel = Channel.EMAIL
    name = "sendgrid"
    log = log
    answer_headers = ("X-Message-Id", "Retry-After", "X-RateLimit-Reset")

    def __init__(self, config: SendGridSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(config.base_url.rstrip("/") + MAIL_SEND_PATH)
        self._from: dict[str, str] = {"email": config.from_email}
        if config.from_name:
            self._from["name"] = config.from_name

    @classmethod
    async def open(cls, settings: Settings | SendGridSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 256,
                   clock: Callable[[], datetime] = utcnow) -> SendGridEmail:
        """Open a pooled client bound to the running loop.

        ``timeout`` bounds each ``send``; connection set-up (including waiting for a pooled
        connection) gets ``connect_timeout`` (default half of ``timeout``), so a timeout before
        anything was sent (TRANSIENT) stays distinguishable from one after (AMBIGUOUS). Raises
        ``ValueError`` when ``sendgrid.api_key`` is not configured.
        """
        config = settings.sendgrid if isinstance(settings, Settings) else settings
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        headers = {"Authorization": f"Bearer {config.api_key.get_secret_value()}",
                   "Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "notiflow-sendgrid/1"}
        return await cls._open(config, headers, timeout=timeout, connect_timeout=connect_timeout,
                               max_connections=max_connections, clock=clock)

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """The Mail Send body SendGrid receives for ``message`` (``subject`` omitted when the
        message has none: SendGrid then rejects it as invalid content)."""
        body: dict[str, Any] = {
            "personalizations": [{"to": [{"email": str(message.recipient)}]}],
            "from": self._from,
            "content": [{"type": "text/plain", "value": message.body}],
            "custom_args": {"message_id": message.message_id,
                            "attempt": str(message.attempt)},
        }
        if trace := current_traceparent():
            body["custom_args"]["traceparent"] = trace
        if message.subject is not None:
            body["subject"] = message.subject
        return body

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(self.payload(message))

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """``202`` with ``X-Message-Id`` is accepted; anything else goes through the tables."""
        status, headers = answer.status, answer.headers
        if status == 202 and headers.get("X-Message-Id"):
            return self._accepted(started, headers["X-Message-Id"])
        if 200 <= status < 300:
            return self._result(STATUS_CLASSES[2], message, started, error_code=f"http_{status}")
        fields = error_fields_of(answer.json())
        rule = classify_response(status, fields)
        wait = (rate_limit_wait(headers, now=self._clock())
                if rule.outcome is Outcome.TRANSIENT else None)
        named = next((f for f in fields if f), None)
        return self._result(rule, message, started,
                            error_code=f"http_{status}:{named}" if named else f"http_{status}",
                            retry_after_s=wait)
