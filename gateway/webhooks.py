"""Provider webhooks: ``POST /webhooks/twilio`` (status callbacks).

A callback is accepted only with a valid ``X-Twilio-Signature`` (forged or unsigned → 403,
nothing written). Valid callbacks are normalised into :class:`Receipt` records on
``notify.receipts`` (confirmed by the broker before the 200), where the reconciler merges them.
The ``message_id`` and ``attempt`` query parameters that the adapter put into the
StatusCallback URL are covered by the signature and correlate the receipt directly.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlsplit

from fastapi import APIRouter, Request, Response

from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.providers.twilio import verify_signature
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import ApiError, bad_request
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

log = logging.getLogger("notiflow.gateway.webhooks")
router = APIRouter()

MAX_BODY = 64 * 1024
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
    await runtime.producer().produce(OutRecord(
        settings.receipts_topic, sid.encode(), receipt.model_dump_json(exclude_none=True).encode(),
        make_headers(receipt.message_id or "", None, None)))
    return Response(status_code=200)
