"""The API's routes for the mail relay's pipe, ``Authorization: Bearer
<smtp.dsn_webhook_secret>``: ``POST /webhooks/smtp-dsn``, bounces (RFC 3464 DSNs; the shared
HTTP side is :mod:`notiflow.gateway.webhooks`), and ``POST /webhooks/unsubscribe-mail``,
mail sent to the ``mailto:`` link of ``List-Unsubscribe`` (``NOTIFLOW_UNSUBSCRIBE__MAILTO``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import ApiError, unprocessable
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.unsubscribe import opt_out
from notiflow.gateway.webhook_openapi import webhook_errors
from notiflow.gateway.webhooks import publish, read_body, refused, verified
from notiflow.providers.smtp import receipts as smtp_receipts
from notiflow.providers.smtp import signature as smtp_signature
from notiflow.settings import Settings
from notiflow.unsubscribe import InvalidToken, UnsubscribeKeys, mailed_token

log = logging.getLogger(__name__)

DSN_SECRET: Final = HTTPBearer(
    scheme_name="DsnWebhookSecret", auto_error=False,
    description="`smtp.dsn_webhook_secret` (the relay's mail pipe cannot sign).")


class DsnAnswer(BaseModel):
    receipts: int
    ignored: int


DSN_BODY: Final = raw_body("An RFC 3464 delivery status notification, raw.", {
    "message/rfc822": {"schema": {"type": "string"}},
    "multipart/report": {"schema": {"type": "string"}}})


router = APIRouter()

MAX_DSN_BODY: Final = 2 * 1024 * 1024


ENVELOPE_TO_HEADER: Final = "X-Envelope-To"
"""The envelope recipient of the bounce, as the relay's pipe names it."""


def bounce_keys(settings: Settings) -> CorrelationKeys:
    """The keys of the bounce addresses' tags; ``403`` when none is configured."""
    try:
        return CorrelationKeys.from_settings(settings)
    except CorrelationKeyMissing:
        raise refused(WebhookRefused("webhook_not_configured",
                                     "no correlation key is configured")) from None


def from_the_pipe(request: Request, runtime: Runtime) -> None:
    """``401`` without an ``Authorization`` header, ``403`` unless it is ``Bearer
    <smtp.dsn_webhook_secret>``."""
    if not request.headers.get("authorization"):
        raise ApiError(401, "unauthorized", "missing_token",
                       "Authorization: Bearer <DSN webhook secret> required",
                       headers={"WWW-Authenticate": "Bearer"})
    verified(runtime, "smtp", lambda config: smtp_signature.check_bearer(
        config.dsn_webhook_secret, request.headers.get("authorization")))


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
    from_the_pipe(request, runtime)
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


class UnsubscribeMailAnswer(BaseModel):
    unsubscribed: int
    """1 when the mail carried a valid unsubscribe token (applied), else 0."""


MAX_MAIL_BODY: Final = 256 * 1024
MAIL_BODY: Final = raw_body("A mail sent to the unsubscribe address, raw (RFC 5322).", {
    "message/rfc822": {"schema": {"type": "string"}}})


@router.post("/webhooks/unsubscribe-mail", response_model=UnsubscribeMailAnswer,
             responses=webhook_errors(401, 413, r413="Bodies are limited to 256 KiB.",
                                      r401="`missing_token`: no `Authorization` header.",
                                      r503="`preferences_contention`, `kafka_unavailable`: "
                                           "the pipe retries."),
             openapi_extra=MAIL_BODY, dependencies=[Depends(DSN_SECRET)])
async def unsubscribe_mail(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One mail to the ``mailto:`` unsubscribe link → the opt-out its token names, stored
    and published before the ``200``. A mail without a valid token (spam, a forged or
    expired link, a reply without the subject) is answered ``200`` with ``unsubscribed:
    0`` and logged, so the relay never bounces anything back to its sender."""
    settings = runtime.settings
    from_the_pipe(request, runtime)
    token = mailed_token(await read_body(request, MAX_MAIL_BODY))
    try:
        keys = UnsubscribeKeys.of(CorrelationKeys.from_settings(settings))
        u = keys.verify(token or "", datetime.now(UTC), settings.unsubscribe.max_age)
    except (CorrelationKeyMissing, InvalidToken) as exc:
        log.info("unsubscribe mail without a valid token: %s", exc)
        return JSONResponse({"unsubscribed": 0})
    await opt_out(runtime, u)
    return JSONResponse({"unsubscribed": 1})


ROUTES: Final = ReceiptRoutes(router, MAX_DSN_BODY)
