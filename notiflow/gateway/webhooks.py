"""Provider webhooks: delivery receipts in, normalised :class:`Receipt` records out.

- ``POST /webhooks/twilio``: Twilio status callbacks, ``X-Twilio-Signature``;
- ``POST /webhooks/sendgrid``: SendGrid Event Webhook batches, ECDSA P-256 signature over the
  timestamp header and the body;
- ``GET`` / ``POST /webhooks/vonage``: Vonage delivery receipts, ``sig`` with the signature
  secret;
- ``POST /webhooks/smtp-dsn``: SMTP bounces (RFC 3464 DSNs) from the relay's mail pipe,
  ``Authorization: Bearer <smtp.dsn_webhook_secret>``;
- ``POST /webhooks/ses``: SES events through SNS, in ``ses_webhook.py`` (it uses this
  module's :func:`read_body`, :func:`publish` and :func:`refused`).

Every receiver keeps one contract: a forged, unsigned or stale post is refused with ``403``
and nothing is written; a genuine one is normalised into receipts, each produced to
``notify.receipts`` (key = provider message id) and confirmed by the broker before the ``200``
(a failed produce is a ``503``, the provider retries, the reconciler drops the duplicates by
``(provider_id, provider_event_id)``). Reports that carry no status (SendGrid ``processed`` /
``deferred``, DSN ``delayed``, Vonage ``unknown``) produce nothing. Correlation hints the
adapters put into the message (Twilio's signed callback query, SendGrid ``custom_args``,
Vonage ``client-ref``, the SMTP bounce address's keyed tag) become ``message_id`` /
``attempt``; the reconciler applies a receipt only to the attempt its provider and provider
message id were recorded for. ``docs/api.md`` has the status mapping tables.

This module is the HTTP side only (read the body, size limits, error answers, publish): the
payload parsers and signature checks are the provider packages' ``receipts`` and ``signature``
modules (:mod:`notiflow.adapters.providers`), which raise
:class:`~notiflow.adapters.providers.webhook.WebhookRefused` for a ``403``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.providers.sendgrid import receipts as sendgrid_receipts
from notiflow.adapters.providers.sendgrid import signature as sendgrid_signature
from notiflow.adapters.providers.smtp import receipts as smtp_receipts
from notiflow.adapters.providers.smtp import signature as smtp_signature
from notiflow.adapters.providers.twilio import receipts as twilio_receipts
from notiflow.adapters.providers.twilio import signature as twilio_signature
from notiflow.adapters.providers.vonage import receipts as vonage_receipts
from notiflow.adapters.providers.vonage import signature as vonage_signature
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway import webhook_guard
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.bodies import read_limited
from notiflow.gateway.errors import ApiError, bad_request, forbidden, unprocessable
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.webhook_openapi import (
    DSN_BODY,
    DSN_SECRET,
    SENDGRID_BODY,
    SENDGRID_SIGNATURE,
    TWILIO_BODY,
    TWILIO_SIGNATURE,
    VONAGE_BODY,
    VONAGE_SIGNATURE,
    DsnAnswer,
    SendgridAnswer,
    VonageAnswer,
    webhook_errors,
)
from notiflow.schemas.messages import Receipt
from notiflow.settings import Settings

log = logging.getLogger("notiflow.gateway.webhooks")
T = TypeVar("T")
router = APIRouter()
_receipts = names.RECEIPTS.create(telemetry.meter())

MAX_BODY = 64 * 1024
MAX_SENDGRID_BODY = 1024 * 1024
"""SendGrid posts a batch once it reaches 768 KB (or every 30 s)."""
MAX_DSN_BODY = 2 * 1024 * 1024


# shared --------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; ``413`` as soon as it exceeds ``limit`` bytes (declared or streamed),
    ``408`` when it is too slow (:func:`~notiflow.gateway.bodies.read_limited`)."""
    return await read_limited(request, limit)


def precheck(check: Callable[[], T]) -> T:
    """``check()`` (one of ``webhook_guard``'s, run before the body is read); ``403`` when
    it refuses."""
    try:
        return check()
    except WebhookRefused as exc:
        raise refused(exc) from None


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


def refused(exc: WebhookRefused) -> ApiError:
    """The ``403`` of a post a provider's signature check refused."""
    return forbidden(exc.reason, exc.message)


def verified(runtime: Runtime, section: str, check: Callable[[Any], T]) -> T:
    """``check(config)`` with the provider account's settings ``section`` as configured now,
    then as configured before a credential reload whose rotation window is still open
    (``notiflow/secrets.py``): the first that does not refuse wins; otherwise ``403`` with
    the current configuration's reason."""
    first: WebhookRefused | None = None
    for config in runtime.keyring.sections(section):
        try:
            return check(config)
        except WebhookRefused as exc:
            first = first or exc
    assert first is not None
    raise refused(first) from None


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "invalid " + ", ".join(".".join(str(p) for p in e["loc"])
                                      for e in exc.errors(include_input=False))
    return str(exc)


# Twilio --------------------------------------------------------------------------------


@router.post("/webhooks/twilio",
             responses={200: {"description": "Taken (empty body)."},
                        **webhook_errors(400, 413, r400="`unknown_callback`.")},
             openapi_extra=TWILIO_BODY, dependencies=[Depends(TWILIO_SIGNATURE)])
async def twilio_status(request: Request, runtime: RuntimeDep) -> Response:
    """One Twilio status callback → at most one receipt; ``403`` unless signed."""
    settings = runtime.settings
    precheck(lambda: webhook_guard.twilio_headers(runtime.keyring.sections("twilio"),
                                                  request.headers))
    raw = await read_body(request, MAX_BODY)
    params = dict(parse_qsl(raw.decode(errors="replace"), keep_blank_values=True))
    verified(runtime, "twilio", lambda config: twilio_signature.check_callback(
        config, str(request.url), params,
        request.headers.get(twilio_signature.SIGNATURE_HEADER)))
    query = dict(request.query_params)
    try:
        receipt = twilio_receipts.callback_receipt(params, query, settings.twilio.provider_id,
                                                   datetime.now(UTC))
    except ValueError as exc:
        raise bad_request("unknown_callback", str(exc)) from None
    if receipt is None:
        return Response(status_code=200)
    await publish(runtime, [receipt], [query.get("traceparent")])
    return Response(status_code=200)


# SendGrid ------------------------------------------------------------------------------


@router.post("/webhooks/sendgrid", response_model=SendgridAnswer,
             responses=webhook_errors(400, 413, r400="`invalid_json`, `invalid_batch`.",
                                      r413="Bodies are limited to 1 MiB."),
             openapi_extra=SENDGRID_BODY, dependencies=[Depends(SENDGRID_SIGNATURE)])
async def sendgrid_events(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One Event Webhook batch → its receipts, all confirmed before the ``200``. ``403`` unless
    signed and fresh; ``400`` when the body is not a JSON array. Malformed events are logged
    and skipped (the answer counts them): a retry of the batch would not mend them."""
    settings = runtime.settings
    precheck(lambda: webhook_guard.sendgrid_headers(
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


VONAGE_ERRORS: Final = webhook_errors(400, 413, r400="`invalid_json`, `invalid_receipt`, "
                                                     "`unknown_receipt`.")


@router.get("/webhooks/vonage", operation_id="vonage_dlr_get", response_model=VonageAnswer,
            responses=VONAGE_ERRORS, dependencies=[Depends(VONAGE_SIGNATURE)])
@router.post("/webhooks/vonage", operation_id="vonage_dlr_post", response_model=VonageAnswer,
             responses=VONAGE_ERRORS, dependencies=[Depends(VONAGE_SIGNATURE)],
             openapi_extra=VONAGE_BODY)
async def vonage_dlr(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One Vonage delivery receipt (GET query, form or JSON POST) → at most one receipt;
    ``403`` as :func:`~notiflow.adapters.providers.vonage.signature.check_receipt` says (every
    receipt, when no signature secret is configured); ``400`` when it is not a delivery
    receipt."""
    settings = runtime.settings
    params = await vonage_params(request)
    verified(runtime, "vonage", lambda config: vonage_signature.check_receipt(
        config, settings.provider_webhook_max_age, params, time.time()))
    try:
        receipt = vonage_receipts.dlr_receipt(params, settings.vonage.provider_id,
                                              datetime.now(UTC))
    except (ValueError, ValidationError) as exc:
        raise bad_request("unknown_receipt", _problem(exc)) from None
    await publish(runtime, [receipt] if receipt else [])
    return JSONResponse({"receipts": 1 if receipt else 0})


# SMTP DSNs -----------------------------------------------------------------------------


ENVELOPE_TO_HEADER: Final = "X-Envelope-To"
"""The envelope recipient of the bounce, as the relay's pipe names it."""


def bounce_keys(settings: Settings) -> CorrelationKeys:
    """The keys of the bounce addresses' tags; ``403`` when none is configured."""
    try:
        return CorrelationKeys.from_settings(settings)
    except CorrelationKeyMissing:
        raise refused(WebhookRefused("webhook_not_configured",
                                     "no correlation key is configured")) from None


@router.post("/webhooks/smtp-dsn", response_model=DsnAnswer,
             responses=webhook_errors(401, 413, 422, r413="Bodies are limited to 2 MiB.",
                                      r401="`missing_token`: no `Authorization` header.",
                                      r422="`not_a_dsn`, `uncorrelated_dsn`."),
             openapi_extra=DSN_BODY, dependencies=[Depends(DSN_SECRET)])
async def smtp_dsn(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One bounce from the relay's mail pipe → its receipts. ``401`` without an
    ``Authorization`` header, ``403`` with another secret (or no correlation key); ``422``
    when the body is not a DSN or is not addressed to a tagged bounce address
    (``X-Envelope-To``, the envelope recipient, when the pipe sends it; else the DSN's own
    recipient headers)."""
    settings = runtime.settings
    if not request.headers.get("authorization"):
        raise ApiError(401, "unauthorized", "missing_token",
                       "Authorization: Bearer <DSN webhook secret> required",
                       headers={"WWW-Authenticate": "Bearer"})
    verified(runtime, "smtp", lambda config: smtp_signature.check_bearer(
        config.dsn_webhook_secret, request.headers.get("authorization")))
    raw = await read_body(request, MAX_DSN_BODY)
    try:
        report = smtp_receipts.parse_dsn(raw, request.headers.get("content-type"))
    except ValueError as exc:
        raise unprocessable("not_a_dsn", str(exc)) from None
    attempt = smtp_receipts.attempt_of(report, bounce_keys(settings),
                                       request.headers.get(ENVELOPE_TO_HEADER))
    if attempt is None:
        raise unprocessable("uncorrelated_dsn", "the DSN is not addressed to a bounce address "
                                                "with a valid tag")
    receipts = smtp_receipts.dsn_receipts(report, settings.smtp.provider_id, datetime.now(UTC),
                                          attempt)
    await publish(runtime, receipts)
    return JSONResponse({"receipts": len(receipts),
                         "ignored": len(report.recipients) - len(receipts)})
