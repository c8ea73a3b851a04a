"""The API's SendGrid receipt route: ``POST /webhooks/sendgrid``, Event Webhook batches signed
with ECDSA P-256 over the timestamp header and the body (the shared HTTP side is
:mod:`notiflow.gateway.webhooks`)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Final

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ValidationError

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import bad_request
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.webhook_openapi import webhook_errors
from notiflow.gateway.webhooks import precheck, problem, publish, read_body, verified
from notiflow.providers.sendgrid import receipts as sendgrid_receipts
from notiflow.providers.sendgrid import signature as sendgrid_signature
from notiflow.schemas.messages import Receipt

SENDGRID_SIGNATURE: Final = APIKeyHeader(
    name="X-Twilio-Email-Event-Webhook-Signature", scheme_name="SendGridSignature",
    auto_error=False,
    description="ECDSA P-256 signature over `X-Twilio-Email-Event-Webhook-Timestamp` and the "
                "raw body, checked with the Event Webhook's public key.")


class SendgridAnswer(BaseModel):
    receipts: int
    malformed: int
    ignored: int


SENDGRID_BODY: Final = raw_body("An Event Webhook batch.", {"application/json": {"schema": {
    "type": "array", "items": {"type": "object"}}}})


log = logging.getLogger("notiflow.gateway.webhooks")
router = APIRouter()

MAX_SENDGRID_BODY: Final = 1024 * 1024
"""SendGrid posts a batch once it reaches 768 KB (or every 30 s)."""


@router.post("/webhooks/sendgrid", response_model=SendgridAnswer,
             responses=webhook_errors(400, 413, r400="`invalid_json`, `invalid_batch`.",
                                      r413="Bodies are limited to 1 MiB."),
             openapi_extra=SENDGRID_BODY, dependencies=[Depends(SENDGRID_SIGNATURE)])
async def sendgrid_events(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One Event Webhook batch → its receipts, all confirmed before the ``200``. ``403`` unless
    signed and fresh; ``400`` when the body is not a JSON array. Malformed events are logged
    and skipped (the answer counts them): a retry of the batch would not mend them."""
    settings = runtime.settings
    precheck(lambda: sendgrid_signature.check_headers(
        runtime.keyring.sections("sendgrid"), request.headers,
        settings.provider_webhook_max_age, time.time()))
    raw = await read_body(request, MAX_SENDGRID_BODY)
    verified(runtime, "sendgrid", lambda config: sendgrid_signature.check_event_post(
        config, settings.provider_webhook_max_age, request.headers, raw, time.time()))
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
            receipt = sendgrid_receipts.event_receipt(event, settings.sendgrid.provider_id, now)
        except (ValueError, ValidationError) as exc:
            problems.append(f"#{i}: {problem(exc)}")
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


ROUTES: Final = ReceiptRoutes(router, MAX_SENDGRID_BODY)
