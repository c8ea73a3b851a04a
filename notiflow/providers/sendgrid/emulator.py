"""SendGrid v3 Mail Send emulator (``notiflow fakes``; dev, tests, benchmarks).

Serves ``POST /sendgrid/v3/mail/send`` on SendGrid's wire format: Bearer API key checked
against the configured one, SendGrid's ``{"errors": [{"message", "field", "help"}]}`` bodies,
``202`` with an empty body and ``X-Message-Id`` on success, 429 with ``X-RateLimit-*`` headers,
and (off by default) the signed Event Webhook: batched JSON arrays of ``processed`` then
``delivered`` or ``bounce`` events, signed with ECDSA P-256 like SendGrid's. Latency, error mix,
outages and accepted-then-hang are knobs over ``/_admin/sendgrid/config``. Every message of a
Mail Send request (one per personalization, its substitutions applied to the content) is
recorded (the newest ``max_records``), recipient included: test infrastructure only;
``/stats`` counts the requests too.

Magic recipients (emulator only): a ``to`` address at ``invalid.example.com`` or
``bounce.invalid`` is rejected like a malformed address (400); one at ``bounce.example.com`` is
accepted and then bounces. A ``from`` address at ``unverified.example.com`` gets SendGrid's 403
for an unverified Sender Identity.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import hmac
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import Field

from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Deliver,
    Emulator,
    MessageRecord,
    WebhookDispatcher,
    json_response,
)
from notiflow.providers.sendgrid.client import MAIL_SEND_PATH
from notiflow.providers.sendgrid.signature import (
    EVENT_SIGNATURE_HEADER,
    EVENT_TIMESTAMP_HEADER,
    event_signature,
)
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/sendgrid"
INVALID_DOMAINS: Final = frozenset({"invalid.example.com", "bounce.invalid"})
BOUNCE_DOMAINS: Final = frozenset({"bounce.example.com"})
UNVERIFIED_SENDER_DOMAINS: Final = frozenset({"unverified.example.com"})
_ADDRESS = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
MAX_PERSONALIZATIONS: Final = 1000
MAX_SUBSTITUTIONS_BYTES: Final = 10_000

UNAUTHORIZED_MESSAGE: Final = "The provided authorization grant is invalid, expired, or revoked"
UNVERIFIED_SENDER_MESSAGE: Final = (
    "The from address does not match a verified Sender Identity. Mail cannot be sent until this "
    "error is resolved. Visit https://sendgrid.com/docs/for-developers/sending-email/"
    "sender-identity/ to see the Sender Identity requirements")


def errors_body(*errors: tuple[str, str | None]) -> bytes:
    """SendGrid's error body for (message, field) pairs."""
    return orjson.dumps({"errors": [{"message": m, "field": f, "help": None}
                                    for m, f in errors]})


class SendGridKnobs(CommonKnobs):
    """Runtime behaviour of the SendGrid emulator."""

    callbacks_enabled: bool = False
    """Post Event Webhook batches (off by default: the receiver is a later issue)."""
    callback_delay_ms: float = Field(50.0, ge=0)
    """Delay before ``processed``; the final event follows after the same delay."""
    bounce_rate: float = Field(0.0, ge=0, le=1)
    """Share of accepted messages whose final event is ``bounce`` instead of ``delivered``."""
    event_webhook_url: str | None = None
    """Where events go; None = the configured ``sendgrid.event_webhook_url``."""
    event_batch_size: int = Field(100, ge=1, le=10_000)
    """Most events per webhook post (events due together are batched)."""


@dataclass(slots=True)
class SendGridRecord(MessageRecord):
    """One message of a Mail Send request (one per personalization, each with its own ``to``
    and ``message_id``); ``sid`` is the ``X-Message-Id``, followed by ``#<index>`` in a
    request of several."""

    subject: str | None = None
    error: str | None = None
    """The first error message of a rejected request."""


Event = dict[str, Any]


def signed_events(key: ec.EllipticCurvePrivateKey) -> Deliver[list[Event]]:
    """Posts one Event Webhook batch (a JSON array and CRLF), signed like SendGrid's."""

    async def deliver(session: aiohttp.ClientSession, url: str, events: list[Event]) -> int:
        payload = orjson.dumps(events) + b"\r\n"
        timestamp = str(int(time.time()))
        headers = {EVENT_SIGNATURE_HEADER: event_signature(key, timestamp, payload),
                   EVENT_TIMESTAMP_HEADER: timestamp, "Content-Type": "application/json"}
        async with session.post(url, data=payload, headers=headers) as resp:
            await resp.read()
            return resp.status

    return deliver


class EventDispatcher(WebhookDispatcher[list[Event]]):
    """Posts signed Event Webhook batches: the events due together (at most ``batch_size``
    a round, each scheduled as a one-event list) go out as one post per URL. ``sent`` and
    ``failed`` count events, ``posts`` counts posts."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        super().__init__("sendgrid", signed_events(key), user_agent="SendGrid Event API",
                         concurrency=16)
        self.batch_size = 100

    def stats(self) -> dict[str, int]:
        return {"scheduled": self.counts["scheduled"], "sent": self.counts["sent"],
                "posts": self.counts["posts"], "failed": self.counts["failed"],
                "dropped": self.counts["dropped"], "pending": len(self._heap)}

    def _pop_due(self) -> list[tuple[str, list[Event]]]:
        now = time.monotonic()
        batches: dict[str, list[Event]] = {}
        taken = 0
        while self._heap and self._heap[0][0] <= now and taken < self.batch_size:
            _, _, url, events = heapq.heappop(self._heap)
            batches.setdefault(url, []).extend(events)
            taken += len(events)
        return list(batches.items())

    def _count(self, item: list[Event], ok: bool) -> None:
        self.counts["posts"] += 1
        self.counts["sent" if ok else "failed"] += len(item)


def _signing_key(settings: Settings) -> ec.EllipticCurvePrivateKey:
    configured = settings.sendgrid.event_webhook_signing_key
    if configured is not None:
        key = serialization.load_pem_private_key(configured.get_secret_value().encode(),
                                                 password=None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
        log.warning("sendgrid.event_webhook_signing_key is not an EC key; using a fresh one")
    return ec.generate_private_key(ec.SECP256R1())


@dataclass(frozen=True, slots=True)
class _Personal:
    """One personalization of a Mail Send body: one message as the emulator records it."""

    to: str | None
    subject: str | None
    body: str | None
    custom_args: dict[str, Any]
    message_id: str | None
    attempt: int | None


@dataclass(frozen=True, slots=True)
class _Request:
    """The parts of a Mail Send body the emulator records and checks: the sender and one
    :class:`_Personal` per personalization (at least one, empty for a body without)."""

    from_: str | None
    personals: tuple[_Personal, ...]

    @property
    def first(self) -> _Personal:
        return self.personals[0]


_NOBODY = _Personal(None, None, None, {}, None, None)


def _strings(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _personal(p: Any, top_args: dict[str, Any], subject: Any, content: str | None) -> _Personal:
    p = p if isinstance(p, dict) else {}
    args = {**top_args, **_strings(p.get("custom_args"))}
    to = None
    tos = p.get("to")
    if isinstance(tos, list) and tos and isinstance(tos[0], dict):
        to = tos[0].get("email") if isinstance(tos[0].get("email"), str) else None
    own_subject = p.get("subject") if isinstance(p.get("subject"), str) else subject
    body = content
    for tag, value in _strings(p.get("substitutions")).items():
        if body is not None and isinstance(tag, str) and isinstance(value, str):
            body = body.replace(tag, value)
    message_id = args.get("message_id") if isinstance(args.get("message_id"), str) else None
    attempt_text = args.get("attempt")
    attempt = (int(attempt_text) if isinstance(attempt_text, str) and attempt_text.isdigit()
               else None)
    return _Personal(to, own_subject if isinstance(own_subject, str) else None, body, args,
                     message_id, attempt)


def _parse(payload: Any) -> _Request:
    if not isinstance(payload, dict):
        return _Request(None, (_NOBODY,))
    top_args = _strings(payload.get("custom_args"))
    sender = payload.get("from")
    from_ = (sender.get("email") if isinstance(sender, dict)
             and isinstance(sender.get("email"), str) else None)
    subject = payload.get("subject") if isinstance(payload.get("subject"), str) else None
    body = None
    content = payload.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        value = content[0].get("value")
        body = value if isinstance(value, str) else None
    personalizations = payload.get("personalizations")
    if not isinstance(personalizations, list) or not personalizations:
        personalizations = [{}]
    return _Request(from_, tuple(_personal(p, top_args, subject, body)
                                 for p in personalizations))


def _domain(address: str) -> str:
    return address.rpartition("@")[2].lower()


RESERVED_HEADERS: Final = frozenset({
    "x-sg-id", "x-sg-eid", "received", "dkim-signature", "content-type",
    "content-transfer-encoding", "to", "from", "subject", "reply-to", "cc", "bcc"})
"""Headers a Mail Send body may not set (SendGrid's reserved headers)."""


def _validate(payload: Any) -> list[tuple[str, str | None]]:
    """SendGrid's 400 errors for a Mail Send body (empty when valid)."""
    if not isinstance(payload, dict):
        return [("Bad Request", None)]
    errors: list[tuple[str, str | None]] = []
    personalizations = payload.get("personalizations")
    all_have_subject = False
    if not isinstance(personalizations, list) or not personalizations:
        errors.append(("The personalizations field is required and must have at least one "
                       "personalization.", "personalizations"))
    else:
        all_have_subject = True
        if len(personalizations) > MAX_PERSONALIZATIONS:
            errors.append((f"The personalizations field can have at most "
                           f"{MAX_PERSONALIZATIONS} personalizations.", "personalizations"))
        for i, p in enumerate(personalizations):
            p = p if isinstance(p, dict) else {}
            all_have_subject &= bool(p.get("subject"))
            subs = p.get("substitutions")
            if subs is not None and (
                    not isinstance(subs, dict)
                    or not all(isinstance(v, str) for v in subs.values())
                    or sum(len(str(k).encode()) + len(str(v).encode())
                           for k, v in subs.items()) > MAX_SUBSTITUTIONS_BYTES):
                errors.append(("Substitutions must be an object of string values of at most "
                               f"{MAX_SUBSTITUTIONS_BYTES} bytes in all.",
                               f"personalizations.{i}.substitutions"))
            tos = p.get("to")
            if not isinstance(tos, list) or not tos:
                errors.append(("The to array is required for all personalization objects, and "
                               "must have at least one email object with a valid email "
                               "address.", f"personalizations.{i}.to"))
                continue
            for j, to in enumerate(tos):
                email = to.get("email") if isinstance(to, dict) else None
                if (not isinstance(email, str) or not _ADDRESS.fullmatch(email)
                        or _domain(email) in INVALID_DOMAINS):
                    errors.append(("Does not contain a valid address.",
                                   f"personalizations.{i}.to.{j}.email"))
    sender = payload.get("from")
    if not isinstance(sender, dict) or "email" not in sender:
        errors.append(("The from object must be provided for every email send. It is an object "
                       "that requires the email parameter, but may also contain a name "
                       "parameter.", "from"))
    elif not isinstance(sender["email"], str) or not _ADDRESS.fullmatch(sender["email"]):
        errors.append(("The from email does not contain a valid address.", "from.email"))
    subject = payload.get("subject")
    if not all_have_subject and (not isinstance(subject, str) or not subject):
        errors.append(("The subject is required. You can get around this requirement if you "
                       "use a template with a subject defined or if every personalization has "
                       "a subject defined.", "subject"))
    content = payload.get("content")
    if not isinstance(content, list) or not content:
        errors.append(("Unless a valid template_id is provided, the content parameter is "
                       "required. There must be at least one defined content block. We "
                       "typically suggest both text/plain and text/html blocks are included, "
                       "but only one block is required.", "content"))
    else:
        for i, block in enumerate(content):
            value = block.get("value") if isinstance(block, dict) else None
            if not isinstance(value, str) or not value:
                errors.append(("The content value must be a string at least one character "
                               "in length.", f"content.{i}.value"))
    headers = payload.get("headers")
    if headers is not None and (
            not isinstance(headers, dict)
            or not all(isinstance(v, str) for v in headers.values())
            or any(str(k).lower() in RESERVED_HEADERS for k in headers)):
        errors.append(("Headers must be an object of string values, none of them a reserved "
                       "header.", "headers"))
    args = payload.get("custom_args")
    if args is not None and (not isinstance(args, dict)
                             or not all(isinstance(v, str) for v in args.values())):
        errors.append(("Custom args must be an object of string values.", "custom_args"))
    return errors


def _token(n: int) -> str:
    return base64.urlsafe_b64encode(os.urandom(n)).rstrip(b"=").decode()


class SendGridEmulator(Emulator[SendGridKnobs]):
    """State and handlers of the SendGrid emulator (one configured account)."""

    callbacks: EventDispatcher

    def __init__(self, settings: Settings) -> None:
        self._signing_key = _signing_key(settings)
        super().__init__("sendgrid", SendGridKnobs, callbacks=EventDispatcher(self._signing_key))
        config = settings.sendgrid
        key = config.api_key.get_secret_value() if config.api_key else None
        self._expected_auth = f"Bearer {key}" if key else None
        self._default_webhook_url = config.event_webhook_url
        self._unauthorized = errors_body((UNAUTHORIZED_MESSAGE, None))
        self._missing_auth = errors_body(("authorization required", None))
        self._too_many = errors_body(("too many requests", None))
        self._internal = errors_body(("internal server error", None))
        self._unavailable = errors_body(("service unavailable", None))
        self._too_large = errors_body(("Payload Too Large", None))
        self.requests = 0
        """Mail Send requests received (``/stats`` ``requests``; records count messages)."""
        if key is None:
            log.warning("sendgrid emulator: no API key configured (NOTIFLOW_SENDGRID__API_KEY);"
                        " every request will get 401")

    @property
    def public_key(self) -> str:
        """The Event Webhook verification key (base64 DER), as SendGrid shows it."""
        der = self._signing_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(der).decode()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(PREFIX + MAIL_SEND_PATH, self.mail_send),
            web.get("/_admin/sendgrid/event-webhook-key", self.get_public_key),
            *self.admin_routes(),
        ]

    def reset(self) -> None:
        super().reset()
        self.requests = 0
        self.callbacks.batch_size = self.knobs.event_batch_size

    def extra_stats(self) -> dict[str, Any]:
        return {**super().extra_stats(), "requests": self.requests}

    def knobs_changed(self) -> None:
        self.callbacks.batch_size = self.knobs.event_batch_size

    async def get_public_key(self, _request: web.Request) -> web.Response:
        return json_response(orjson.dumps({"public_key": self.public_key}), 200)

    async def mail_send(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raw = None
        try:
            payload = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            payload = None
        req = _parse(payload)

        self.requests += 1

        def record(outcome: str, status: int, *, sid: str | None = None, hang: bool = False,
                   errors: list[tuple[str, str | None]] | None = None) -> None:
            for i, p in enumerate(req.personals):
                error = None
                if errors:
                    mine = f"personalizations.{i}."
                    error = next((m for m, f in errors if f and f.startswith(mine)),
                                 errors[0][0])
                self.messages.add(SendGridRecord(
                    received_at, outcome, status, None,
                    f"{sid}#{i}" if sid and len(req.personals) > 1 else sid,
                    p.message_id, p.attempt, p.to, req.from_, p.body, hang,
                    subject=p.subject, error=error))

        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return json_response(self._unavailable, 503)
        auth = request.headers.get("Authorization")
        if auth is None:
            record("unauthorized", 401)
            return json_response(self._missing_auth, 401)
        if self._expected_auth is None or not hmac.compare_digest(auth.encode(),
                                                                  self._expected_auth.encode()):
            record("unauthorized", 401)
            return json_response(self._unauthorized, 401)
        if raw is None:
            record("too_large", 413)
            return json_response(self._too_large, 413)
        if self.draw(knobs.error_rate_429):
            record("rate_limited", 429)
            reset = math.ceil(received_at + knobs.retry_after_s)
            return json_response(self._too_many, 429, {"X-RateLimit-Limit": "600",
                                                       "X-RateLimit-Remaining": "0",
                                                       "X-RateLimit-Reset": str(reset)})
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status)
            return json_response(self._internal if status == 500 else self._unavailable, status)
        errors = _validate(payload)
        if errors:
            record("invalid", 400, errors=errors)
            return json_response(errors_body(*errors), 400)
        assert req.from_ is not None
        if _domain(req.from_) in UNVERIFIED_SENDER_DOMAINS:
            record("forbidden", 403, errors=[(UNVERIFIED_SENDER_MESSAGE, "from")])
            return json_response(errors_body((UNVERIFIED_SENDER_MESSAGE, "from")), 403)
        message_id = _token(16)
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 202, sid=message_id, hang=hang)
        url = knobs.event_webhook_url or self._default_webhook_url
        if knobs.callbacks_enabled and url:
            for i, p in enumerate(req.personals):
                self._schedule_events(knobs, url, message_id, i, p)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return web.Response(status=202, headers={"X-Message-Id": message_id})

    def _schedule_events(self, knobs: SendGridKnobs, url: str, message_id: str, index: int,
                         p: _Personal) -> None:
        assert p.to is not None
        delay = knobs.callback_delay_ms / 1000
        now = time.monotonic()
        sg_message_id = f"{message_id}.filterdrecv-emulator-{os.urandom(4).hex()}-{index}.0"
        common = {**{k: v for k, v in p.custom_args.items() if isinstance(v, str)},
                  "email": p.to, "sg_message_id": sg_message_id,
                  "smtp-id": f"<{message_id}@emulator.sendgrid.net>"}
        wall = int(time.time())
        self.callbacks.schedule(now + delay, url, [{
            **common, "event": "processed", "sg_event_id": _token(16),
            "timestamp": wall + int(delay)}])
        final: dict[str, Any]
        if _domain(p.to) in BOUNCE_DOMAINS or self.draw(knobs.bounce_rate):
            final = {"event": "bounce", "type": "bounce", "status": "5.1.1",
                     "reason": "550 5.1.1 The email account that you tried to reach does not "
                               "exist.", "bounce_classification": "Invalid Address"}
        else:
            final = {"event": "delivered", "response": "250 2.0.0 OK"}
        self.callbacks.schedule(now + 2 * delay, url, [{
            **common, **final, "sg_event_id": _token(16), "timestamp": wall + int(2 * delay)}])
