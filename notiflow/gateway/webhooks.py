"""Provider webhooks: delivery receipts in, normalised :class:`Receipt` records out.

- ``POST /webhooks/twilio``: Twilio status callbacks, ``X-Twilio-Signature``;
- ``POST /webhooks/sendgrid``: SendGrid Event Webhook batches, ECDSA P-256 signature over the
  timestamp header and the body;
- ``GET`` / ``POST /webhooks/vonage``: Vonage delivery receipts, ``sig`` with the signature
  secret;
- ``POST /webhooks/smtp-dsn``: SMTP bounces (RFC 3464 DSNs) from the relay's mail pipe,
  ``Authorization: Bearer <smtp.dsn_webhook_secret>``.

Every receiver keeps one contract: a forged, unsigned or stale post is refused with ``403``
and nothing is written; a genuine one is normalised into receipts, each produced to
``notify.receipts`` (key = provider message id) and confirmed by the broker before the ``200``
(a failed produce is a ``503``, the provider retries, the reconciler drops the duplicates by
``(provider_id, provider_event_id)``). Reports that carry no status (SendGrid ``processed`` /
``deferred``, DSN ``delayed``, Vonage ``unknown``) produce nothing. Correlation hints the
adapters put into the message (Twilio's signed callback query, SendGrid ``custom_args``,
Vonage ``client-ref``, SMTP ``X-Notiflow-*`` headers / ``Message-ID`` / ``ENVID``) become
``message_id`` / ``attempt``. ``docs/api.md`` has the status mapping tables.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import Message
from email.parser import BytesParser, HeaderParser
from email.utils import parsedate_to_datetime
from typing import Final
from urllib.parse import parse_qsl, urlsplit

import orjson
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import SecretStr, ValidationError

from notiflow import names, telemetry
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.providers.sendgrid import (
    EVENT_SIGNATURE_HEADER,
    EVENT_TIMESTAMP_HEADER,
    load_event_public_key,
    verify_event_signature,
)
from notiflow.adapters.providers.smtp import (
    ATTEMPT_HEADER,
    MESSAGE_ID_DOMAIN,
    MESSAGE_ID_HEADER,
    message_id_header,
)
from notiflow.adapters.providers.twilio import verify_signature
from notiflow.adapters.providers.vonage import DLR_STATUSES, parse_client_ref
from notiflow.adapters.providers.vonage import verify_signature as verify_vonage_signature
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import ApiError, bad_request, forbidden, unprocessable
from notiflow.gateway.runtime import Runtime
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt
from notiflow.schemas.status import MAX_ATTEMPT
from notiflow.settings import SendGridSettings, VonageSettings

log = logging.getLogger("notiflow.gateway.webhooks")
router = APIRouter()
_receipts = names.RECEIPTS.create(telemetry.meter())

MAX_BODY = 64 * 1024
MAX_SENDGRID_BODY = 8 * 1024 * 1024
MAX_DSN_BODY = 2 * 1024 * 1024
MAX_ERROR_CODE = 200
_MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

TWILIO_STATUS: dict[str, Status | None] = {
    "accepted": None,
    "scheduled": None,
    "queued": None,
    "sending": None,
    "sent": Status.SENT,
    "delivered": Status.DELIVERED,
    "read": Status.OPENED,
    "undelivered": Status.FAILED,
    "failed": Status.FAILED,
    "canceled": Status.FAILED,
}
"""Twilio MessageStatus → notiflow status; None = a state before or at provider acceptance,
already known from the send response."""

SENDGRID_EVENTS: Final[Mapping[str, Status | None]] = {
    "processed": None,
    "deferred": None,
    "delivered": Status.DELIVERED,
    "bounce": Status.BOUNCED,
    "dropped": Status.FAILED,
    "open": Status.OPENED,
    "click": Status.CLICKED,
    "spamreport": Status.DELIVERED,
    "unsubscribe": Status.DELIVERED,
    "group_unsubscribe": Status.DELIVERED,
    "group_resubscribe": Status.DELIVERED,
}
"""SendGrid ``event`` → notiflow status; None = no news (``processed`` is the acceptance the
send response already proved, ``deferred`` a transient delay). Spam reports and
(un)subscriptions prove delivery; their ``raw_status`` tells the reconciler to act on the
address. Event types not listed are ignored."""

SENDGRID_BOUNCE_TYPES: Final[Mapping[str, Status]] = {
    "bounce": Status.BOUNCED,
    "blocked": Status.FAILED,
}
"""``type`` of a ``bounce`` event: a hard bounce (the address is bad) or a block (the receiving
server refused this message; the address stays valid)."""

_SG_SUFFIX = re.compile(r"\.(?:filter|recv)")

DSN_ACTIONS: Final[Mapping[str, Status | None]] = {
    "failed": Status.BOUNCED,
    "delayed": None,
    "delivered": Status.DELIVERED,
    "relayed": Status.SENT,
    "expanded": Status.SENT,
}
"""RFC 3464 ``Action`` → notiflow status; ``failed`` is refined by :func:`dsn_status`."""

SOFT_FAILURE_CODES: Final = frozenset({"5.2.2", "5.4.7"})
SOFT_FAILURE_SUBJECTS: Final = frozenset({"5.3", "5.7"})
"""Permanent failures that say nothing bad about the address (mailbox full, delivery time
expired, the receiving system's trouble, policy blocks): FAILED rather than BOUNCED."""

_ENHANCED = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})\b")
_OUR_MESSAGE_ID = re.compile(
    rf"<?([A-Za-z0-9_-]{{1,64}})\.(\d{{1,5}})@{re.escape(MESSAGE_ID_DOMAIN)}>?")
_XTEXT = re.compile(r"\+([0-9A-F]{2})")
_DSN_PARSER = BytesParser(policy=policy.default)
_unsigned_warned: set[str] = set()


# shared --------------------------------------------------------------------------------


def too_large(limit: int) -> ApiError:
    return ApiError(413, "payload_too_large", "body_too_large",
                    f"webhook bodies are limited to {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; ``413`` once it exceeds ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def publish(runtime: Runtime, receipts: Sequence[Receipt],
                  traces: Sequence[str | None] = ()) -> None:
    """Produce every receipt to ``notify.receipts``; returns once the broker acknowledged all
    of them, raises :class:`~notiflow.adapters.kafka_io.DeliveryFailed` otherwise.

    Each receipt gets a ``notiflow.receipt`` span: a child of the provider call whose
    ``traceparent`` the provider echoed (``traces[i]``: Twilio's signed callback URL,
    SendGrid ``custom_args``), linked to this HTTP request's span; without one, a child of
    the request span. The record's ``traceparent`` header is that span's."""
    if not receipts:
        return
    producer = runtime.producer()
    topic = runtime.settings.receipts_topic
    request = telemetry.link_to(telemetry.current_traceparent())
    records = []
    for i, r in enumerate(receipts):
        trace = traces[i] if i < len(traces) else None
        attrs = {names.ATTR_MESSAGE_ID: r.message_id, names.ATTR_PROVIDER: r.provider_id,
                 names.ATTR_STATUS: r.status.value}
        with telemetry.span(names.RECEIPT, attrs, parent=trace,
                            links=[request] if telemetry.context_of(trace) else []):
            records.append(OutRecord(
                topic, r.provider_message_id.encode(),
                r.model_dump_json(exclude_none=True).encode(),
                make_headers(r.message_id or "", None, None, telemetry.current_traceparent())))
    outcomes = await asyncio.gather(*(producer.produce(rec) for rec in records),
                                    return_exceptions=True)
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
    channels = {route.provider_id: route.channel.value for route in runtime.settings.routes}
    for r in receipts:
        _receipts.add(1, {"provider": r.provider_id, "status": r.status.value,
                          "channel": channels.get(r.provider_id, "")})


def correlation(message_id: object, attempt: object) -> tuple[str | None, int | None]:
    """The ``(message_id, attempt)`` hint of a report: ``(None, None)`` unless the message id
    has our shape; the attempt only when it is a whole number in range."""
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        return None, None
    number: int | None = None
    if isinstance(attempt, str) and attempt.isdigit():
        number = int(attempt)
    elif isinstance(attempt, int) and not isinstance(attempt, bool):
        number = attempt
    return message_id, number if number is not None and 1 <= number <= MAX_ATTEMPT else None


def _clip(value: object) -> str | None:
    if value is None or value == "":
        return None
    return str(value)[:MAX_ERROR_CODE]


# Twilio --------------------------------------------------------------------------------


def signed_url(request: Request, configured: str | None) -> str:
    """The URL Twilio signed: the configured public callback URL (scheme, host, path) with the
    request's query, or the request URL itself when none is configured."""
    if not configured:
        return str(request.url)
    base = urlsplit(configured)
    query = request.url.query
    return f"{base.scheme}://{base.netloc}{base.path}" + (f"?{query}" if query else "")


@router.post("/webhooks/twilio")
async def twilio_status(request: Request, runtime: RuntimeDep) -> Response:
    """One Twilio status callback → at most one receipt; ``403`` unless signed."""
    settings = runtime.settings
    token = settings.twilio.auth_token
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise bad_request("body_too_large", "webhook body too large")
    params = dict(parse_qsl(raw.decode(errors="replace"), keep_blank_values=True))
    url = signed_url(request, settings.twilio.status_callback_url)
    if token is None or not verify_signature(token.get_secret_value(), url, params,
                                             request.headers.get("X-Twilio-Signature")):
        raise ApiError(403, "forbidden", "invalid_signature",
                       "X-Twilio-Signature does not match this request")
    sid = params.get("MessageSid") or params.get("SmsSid")
    raw_status = (params.get("MessageStatus") or params.get("SmsStatus") or "").lower()
    if not sid or raw_status not in TWILIO_STATUS:
        raise bad_request("unknown_callback", "MessageSid or MessageStatus missing or unknown")
    status = TWILIO_STATUS[raw_status]
    if status is None:
        return Response(status_code=200)
    query = dict(request.query_params)
    attempt = query.get("attempt", "")
    receipt = Receipt(
        provider_id=settings.twilio.provider_id,
        provider_event_id=f"{sid}:{raw_status}",
        provider_message_id=sid,
        status=status,
        occurred_at=datetime.now(UTC),
        raw_status=raw_status,
        error_code=params.get("ErrorCode") or None,
        message_id=query.get("message_id") or None,
        attempt=int(attempt) if attempt.isdigit() else None,
    )
    await publish(runtime, [receipt], [query.get("traceparent")])
    return Response(status_code=200)


# SendGrid ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _sendgrid_key(text: str) -> ec.EllipticCurvePublicKey | None:
    try:
        return load_event_public_key(text)
    except (ValueError, TypeError):
        log.error("sendgrid.event_webhook_public_key is not a usable EC public key")
        return None


def verify_sendgrid(config: SendGridSettings, max_age: timedelta,
                    headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Raise ``403`` unless ``body`` carries SendGrid's signature over the timestamp header
    and body, and that timestamp is within ``max_age`` of ``now`` (Unix seconds)."""
    key = (_sendgrid_key(config.event_webhook_public_key)
           if config.event_webhook_public_key else None)
    if key is None:
        raise forbidden("signature_not_configured",
                      "no Event Webhook verification key is configured")
    signature = headers.get(EVENT_SIGNATURE_HEADER)
    stamp = headers.get(EVENT_TIMESTAMP_HEADER)
    if not signature or not stamp:
        raise forbidden("missing_signature", f"{EVENT_SIGNATURE_HEADER} and "
                                           f"{EVENT_TIMESTAMP_HEADER} are required")
    if not stamp.isdigit() or abs(now - int(stamp)) > max_age.total_seconds():
        raise forbidden("stale_timestamp", f"{EVENT_TIMESTAMP_HEADER} is not within "
                                         f"{int(max_age.total_seconds())} s of now")
    if not verify_event_signature(key, body, signature, stamp):
        raise forbidden("invalid_signature", f"{EVENT_SIGNATURE_HEADER} does not match this "
                                           "request")


def sendgrid_message_id(sg_message_id: str) -> str:
    """The ``X-Message-Id`` of the send response that an event's ``sg_message_id`` extends
    (``<X-Message-Id>.filterdrecv-…`` → ``<X-Message-Id>``)."""
    suffix = _SG_SUFFIX.search(sg_message_id)
    return sg_message_id[:suffix.start()] if suffix else sg_message_id.split(".", 1)[0]


def _epoch(value: object, default: datetime) -> datetime:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return default
    return default


def sendgrid_receipt(event: object, provider_id: str, now: datetime) -> Receipt | None:
    """The receipt of one Event Webhook event; None for an event without news (see
    :data:`SENDGRID_EVENTS`, unknown types included). ``ValueError`` (or a pydantic
    ``ValidationError``) when the event is malformed."""
    if not isinstance(event, dict):
        raise ValueError("event is not a JSON object")
    kind = event.get("event")
    if not isinstance(kind, str) or not kind:
        raise ValueError("event type missing")
    status = SENDGRID_EVENTS.get(kind)
    if status is None:
        return None
    raw_status, error_code = kind, None
    if kind == "bounce":
        bounce_type = event.get("type", "bounce")
        if not isinstance(bounce_type, str) or bounce_type not in SENDGRID_BOUNCE_TYPES:
            raise ValueError("unknown bounce type")
        status, raw_status = SENDGRID_BOUNCE_TYPES[bounce_type], bounce_type
        error_code = _clip(event.get("status"))
    elif kind == "dropped":
        error_code = _clip(event.get("reason"))
    event_id, sg_message_id = event.get("sg_event_id"), event.get("sg_message_id")
    if not isinstance(event_id, str) or not event_id:
        raise ValueError("sg_event_id missing")
    if not isinstance(sg_message_id, str) or not sg_message_id:
        raise ValueError("sg_message_id missing")
    message_id, attempt = correlation(event.get("message_id"), event.get("attempt"))
    return Receipt(
        provider_id=provider_id,
        provider_event_id=event_id,
        provider_message_id=sendgrid_message_id(sg_message_id),
        status=status,
        occurred_at=_epoch(event.get("timestamp"), now),
        raw_status=raw_status,
        error_code=error_code,
        message_id=message_id,
        attempt=attempt,
    )


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "invalid " + ", ".join(".".join(str(p) for p in e["loc"])
                                      for e in exc.errors(include_input=False))
    return str(exc)


@router.post("/webhooks/sendgrid")
async def sendgrid_events(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One Event Webhook batch → its receipts, all confirmed before the ``200``. ``403`` unless
    signed and fresh; ``400`` when the body is not a JSON array. Malformed events are logged
    and skipped (the answer counts them): a retry of the batch would not mend them."""
    settings = runtime.settings
    raw = await read_body(request, MAX_SENDGRID_BODY)
    verify_sendgrid(settings.sendgrid, settings.provider_webhook_max_age, request.headers,
                    raw, time.time())
    try:
        events = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("invalid_json", "the body is not JSON") from None
    if not isinstance(events, list):
        raise bad_request("invalid_batch", "expected a JSON array of events")
    now = datetime.now(UTC)
    receipts: list[Receipt] = []
    traces: list[str | None] = []
    problems: list[str] = []
    for i, event in enumerate(events):
        try:
            receipt = sendgrid_receipt(event, settings.sendgrid.provider_id, now)
        except (ValueError, ValidationError) as exc:
            problems.append(f"#{i}: {_problem(exc)}")
            continue
        if receipt is not None:
            receipts.append(receipt)
            trace = event.get("traceparent") if isinstance(event, dict) else None
            traces.append(trace if isinstance(trace, str) else None)
    if problems:
        log.warning("sendgrid batch: %d of %d events malformed and skipped (%s)",
                    len(problems), len(events), "; ".join(problems[:5]))
    await publish(runtime, receipts, traces)
    malformed = len(problems)
    return JSONResponse({"receipts": len(receipts), "malformed": malformed,
                         "ignored": len(events) - len(receipts) - malformed})


# Vonage --------------------------------------------------------------------------------


async def vonage_params(request: Request) -> dict[str, str]:
    """The receipt's parameters: the query, overlaid by a form or JSON object body."""
    params = dict(request.query_params)
    raw = await read_body(request, MAX_BODY)
    if not raw.strip():
        return params
    if request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_request("invalid_json", "the body is not JSON") from None
        if not isinstance(body, dict) or not all(
                v is None or isinstance(v, str | int | float) for v in body.values()):
            raise bad_request("invalid_receipt", "expected a flat JSON object")
        params.update({str(k): str(v) for k, v in body.items() if v is not None})
        return params
    try:
        params.update(parse_qsl(raw.decode(), keep_blank_values=True))
    except UnicodeDecodeError:
        raise bad_request("invalid_receipt", "the form body is not UTF-8") from None
    return params


def verify_vonage(config: VonageSettings, max_age: timedelta, params: Mapping[str, str],
                  now: float) -> None:
    """Raise ``403`` for a receipt of another account (``api-key``), and, when a signature
    secret is configured, for one without a valid ``sig`` or with a ``timestamp`` further than
    ``max_age`` from ``now``. Without a secret, receipts are taken unsigned (warned once)."""
    given_key = params.get("api-key")
    if config.api_key and given_key and not hmac.compare_digest(given_key.encode(),
                                                                config.api_key.encode()):
        raise forbidden("wrong_account", "the receipt names another Vonage account")
    secret = config.signature_secret
    if secret is None:
        if config.provider_id not in _unsigned_warned:
            _unsigned_warned.add(config.provider_id)
            log.warning("vonage.signature_secret is not set: delivery receipts are taken "
                        "unsigned")
        return
    if not params.get("sig"):
        raise forbidden("missing_signature", "sig is required")
    stamp = params.get("timestamp", "")
    if not stamp.isdigit() or abs(now - int(stamp)) > max_age.total_seconds():
        raise forbidden("stale_timestamp",
                      f"timestamp is not within {int(max_age.total_seconds())} s of now")
    if not verify_vonage_signature(secret.get_secret_value(), params, now=now,
                                   max_skew_s=max_age.total_seconds()):
        raise forbidden("invalid_signature", "sig does not match this receipt")


def _vonage_time(value: str | None, default: datetime) -> datetime:
    if not value:
        return default
    try:
        return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return default


def vonage_receipt(params: Mapping[str, str], provider_id: str,
                   now: datetime) -> Receipt | None:
    """The receipt of one DLR; None for ``status=unknown``; ``ValueError`` without a
    ``messageId`` or with an unknown ``status``."""
    sid = params.get("messageId")
    raw_status = params.get("status", "").lower()
    if not sid or raw_status not in DLR_STATUSES:
        raise ValueError("messageId or status missing or unknown")
    status = DLR_STATUSES[raw_status]
    if status is None:
        return None
    ref = parse_client_ref(params.get("client-ref"))
    message_id, attempt = correlation(*ref) if ref else (None, None)
    err = params.get("err-code")
    return Receipt(
        provider_id=provider_id,
        provider_event_id=f"{sid}:{raw_status}",
        provider_message_id=sid,
        status=status,
        occurred_at=_vonage_time(params.get("message-timestamp"), now),
        raw_status=raw_status,
        error_code=_clip(err) if err and err != "0" else None,
        message_id=message_id,
        attempt=attempt,
    )


@router.api_route("/webhooks/vonage", methods=["GET", "POST"])
async def vonage_dlr(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One Vonage delivery receipt (GET query, form or JSON POST) → at most one receipt;
    ``403`` as :func:`verify_vonage` says; ``400`` when it is not a delivery receipt."""
    settings = runtime.settings
    params = await vonage_params(request)
    verify_vonage(settings.vonage, settings.provider_webhook_max_age, params, time.time())
    try:
        receipt = vonage_receipt(params, settings.vonage.provider_id, datetime.now(UTC))
    except (ValueError, ValidationError) as exc:
        raise bad_request("unknown_receipt", _problem(exc)) from None
    await publish(runtime, [receipt] if receipt else [])
    return JSONResponse({"receipts": 1 if receipt else 0})


# SMTP DSNs -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecipientReport:
    """One per-recipient block of a DSN."""

    action: str
    status: str | None
    """The enhanced status code (``5.1.1``), without comments."""
    last_attempt: datetime | None


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What a DSN says about one message we sent."""

    message_id: str | None
    attempt: int | None
    provider_message_id: str | None
    recipients: tuple[RecipientReport, ...]
    reported_at: datetime | None


def check_bearer(secret: SecretStr | None, header: str | None) -> None:
    """Raise ``403`` unless ``header`` is ``Bearer <secret>`` (constant-time compare)."""
    if secret is None:
        raise forbidden("webhook_not_configured", "no DSN webhook secret is configured")
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), secret.get_secret_value().encode()):
        raise forbidden("invalid_token", "Authorization: Bearer <DSN webhook secret> required")


def _date(value: object) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(str(value))
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _field(block: Message, name: str) -> str | None:
    value = block.get(name)
    return str(value).strip() if value is not None and str(value).strip() else None


def _delivery_status(message: Message) -> Message | None:
    return next((p for p in message.walk() if p.get_content_type() == "message/delivery-status"),
                None)


def _returned_headers(message: Message) -> Message | None:
    """The original message's headers a DSN returns (``text/rfc822-headers`` or
    ``message/rfc822``), if any."""
    for part in message.walk():
        kind = part.get_content_type()
        if kind in ("text/rfc822-headers", "message/rfc822-headers"):
            payload = part.get_payload(decode=True)
            text = (payload.decode("utf-8", "replace") if isinstance(payload, bytes)
                    else str(part.get_payload()))
            return HeaderParser(policy=policy.default).parsestr(text)
        if kind == "message/rfc822":
            inner = part.get_payload()
            if isinstance(inner, list) and inner and isinstance(inner[0], Message):
                return inner[0]
    return None


def _xtext_decode(value: str) -> str:
    return _XTEXT.sub(lambda m: chr(int(m.group(1), 16)), value)


def _hint(original: Message | None, envid: str | None) -> tuple[str | None, int | None]:
    if original is not None:
        found = correlation(_field(original, MESSAGE_ID_HEADER),
                            _field(original, ATTEMPT_HEADER))
        if found[0] is not None:
            return found
        ours = _OUR_MESSAGE_ID.fullmatch(_field(original, "Message-ID") or "")
        if ours:
            return correlation(ours.group(1), ours.group(2))
    if envid:
        message_id, _, attempt = _xtext_decode(envid).rpartition(".")
        return correlation(message_id, attempt)
    return None, None


def parse_dsn(raw: bytes, content_type: str | None = None) -> DeliveryReport:
    """Read an RFC 3464 delivery status notification posted whole (``message/rfc822``) or as
    its own ``multipart/report`` body (the MIME type then comes from ``content_type``).
    ``ValueError`` when there is no ``message/delivery-status`` part with recipients."""
    message = _DSN_PARSER.parsebytes(raw)
    report = _delivery_status(message)
    if report is None and content_type and content_type.lower().startswith("multipart/"):
        message = _DSN_PARSER.parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode(
            "latin-1", "replace") + raw)
        report = _delivery_status(message)
    if report is None:
        raise ValueError("no message/delivery-status part")
    payload = report.get_payload()
    blocks = [b for b in payload if isinstance(b, Message)] if isinstance(payload, list) else []
    if len(blocks) < 2:
        raise ValueError("the delivery-status part has no per-recipient fields")
    per_message = blocks[0]
    recipients = []
    for block in blocks[1:]:
        action = (_field(block, "Action") or "").lower()
        code = _ENHANCED.match(_field(block, "Status") or "")
        recipients.append(RecipientReport(
            action=action, status=".".join(code.groups()) if code else None,
            last_attempt=_date(block.get("Last-Attempt-Date"))))
    original = _returned_headers(message)
    message_id, attempt = _hint(original, _field(per_message, "Original-Envelope-Id"))
    provider_message_id = _field(per_message, "X-Postfix-Queue-ID")
    if provider_message_id is None and original is not None:
        provider_message_id = (_field(original, "Message-ID") or "").strip("<>") or None
    if provider_message_id is None and message_id is not None and attempt is not None:
        provider_message_id = message_id_header(message_id, attempt)[1:-1]
    return DeliveryReport(message_id, attempt, provider_message_id, tuple(recipients),
                          _date(message.get("Date")))


def dsn_status(action: str, code: str | None) -> Status | None:
    """The status of one recipient's report: ``failed`` with a 5.x.x code is BOUNCED unless
    the code is a soft failure (:data:`SOFT_FAILURE_CODES`, :data:`SOFT_FAILURE_SUBJECTS`),
    any other ``failed`` is FAILED; other actions map by :data:`DSN_ACTIONS`."""
    if action != "failed":
        return DSN_ACTIONS.get(action)
    hard = (code is not None and code.startswith("5.") and code not in SOFT_FAILURE_CODES
            and code.rsplit(".", 1)[0] not in SOFT_FAILURE_SUBJECTS)
    return Status.BOUNCED if hard else Status.FAILED


def dsn_receipts(report: DeliveryReport, provider_id: str, now: datetime) -> list[Receipt]:
    """The receipts of a DSN (none for ``delayed`` or unknown actions). Each recipient's
    event id is derived from the report's content, so the same DSN posted twice dedups."""
    if report.provider_message_id is None:
        return []
    receipts = []
    for i, r in enumerate(report.recipients):
        status = dsn_status(r.action, r.status)
        if status is None:
            continue
        receipts.append(Receipt(
            provider_id=provider_id,
            provider_event_id=f"dsn:{report.provider_message_id}:{i}:{r.action}:"
                              f"{r.status or '-'}",
            provider_message_id=report.provider_message_id,
            status=status,
            occurred_at=r.last_attempt or report.reported_at or now,
            raw_status=r.action,
            error_code=r.status if r.action == "failed" else None,
            message_id=report.message_id,
            attempt=report.attempt,
        ))
    return receipts


@router.post("/webhooks/smtp-dsn")
async def smtp_dsn(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One bounce from the relay's mail pipe → its receipts. ``403`` without the bearer
    secret; ``422`` when the body is not a DSN or names no message we could correlate."""
    settings = runtime.settings
    check_bearer(settings.smtp.dsn_webhook_secret, request.headers.get("authorization"))
    raw = await read_body(request, MAX_DSN_BODY)
    try:
        report = parse_dsn(raw, request.headers.get("content-type"))
    except ValueError as exc:
        raise unprocessable("not_a_dsn", str(exc)) from None
    if report.message_id is None and report.provider_message_id is None:
        raise unprocessable("uncorrelated_dsn", "the DSN names no message id, Message-ID, "
                                                "ENVID or queue id")
    receipts = dsn_receipts(report, settings.smtp.provider_id, datetime.now(UTC))
    await publish(runtime, receipts)
    return JSONResponse({"receipts": len(receipts),
                         "ignored": len(report.recipients) - len(receipts)})
