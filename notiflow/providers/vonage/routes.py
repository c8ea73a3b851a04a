"""The API's Vonage routes, both signed with ``sig`` (the signature secret):
``GET`` / ``POST /webhooks/vonage``, delivery receipts (the shared HTTP side is
:mod:`notiflow.gateway.webhooks`), and ``GET`` / ``POST /webhooks/vonage/inbound``, texts
people send to the account's numbers, whose STOP and START change consent
(:mod:`notiflow.gateway.inbound_sms`). Vonage's inbound webhook carries no reply: a number's
answers to STOP and HELP are set where it is registered (its 10DLC campaign)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyQuery
from pydantic import BaseModel, ValidationError

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import bad_request
from notiflow.gateway.inbound_sms import take_inbound
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.webhook_openapi import FLAT_OBJECT, FORM, webhook_errors
from notiflow.gateway.webhooks import MAX_BODY, problem, publish, read_body, verified
from notiflow.providers.vonage import receipts as vonage_receipts
from notiflow.providers.vonage import signature as vonage_signature
from notiflow.sms_keywords import InboundSms, e164, keyword_of

VONAGE_SIGNATURE: Final = APIKeyQuery(
    name="sig", scheme_name="VonageSignature", auto_error=False,
    description="SHA-256 HMAC of the other parameters with the signature secret (in the "
                "query, form or JSON body); without a configured secret every receipt is "
                "refused.")


class VonageAnswer(BaseModel):
    receipts: int


VONAGE_BODY: Final = {"requestBody": {**raw_body("A delivery receipt (or in the query).", {
    FORM: {"schema": FLAT_OBJECT}, "application/json": {"schema": FLAT_OBJECT}})["requestBody"],
    "required": False}}


router = APIRouter()


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
    ``403`` as :func:`~notiflow.providers.vonage.signature.check_receipt` says (every
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
        raise bad_request("unknown_receipt", problem(exc)) from None
    await publish(runtime, [receipt] if receipt else [])
    return JSONResponse({"receipts": 1 if receipt else 0})


class VonageInboundAnswer(BaseModel):
    keyword: str | None
    """``STOP``, ``START`` or ``HELP`` when the text was one (and was applied), else null."""


def inbound_sms(params: dict[str, str], provider_id: str) -> InboundSms:
    """The text of an inbound-message webhook; ValueError when it is not one."""
    missing = [k for k in ("msisdn", "to", "messageId") if not params.get(k)]
    if missing:
        raise ValueError(f"not an inbound message: {', '.join(missing)} missing")
    text = params.get("text", "")
    return InboundSms(provider_id, e164(params["msisdn"]), e164(params["to"]), text,
                      keyword_of(text))


def account_numbers(from_name: str) -> tuple[str, ...]:
    """The account's own sender when it is a number (Vonage writes it without ``+``)."""
    digits = from_name.removeprefix("+")
    return (e164(digits),) if digits.isdigit() else ()


INBOUND_ERRORS: Final = webhook_errors(
    400, 413, r400="`invalid_json`, `invalid_receipt`, `unknown_callback`.",
    r503="`kafka_unavailable`, `cassandra_unavailable`, `preferences_contention`: Vonage posts "
         "again; nothing is applied twice.")


@router.get("/webhooks/vonage/inbound", operation_id="vonage_inbound_get",
            response_model=VonageInboundAnswer, responses=INBOUND_ERRORS,
            dependencies=[Depends(VONAGE_SIGNATURE)])
@router.post("/webhooks/vonage/inbound", operation_id="vonage_inbound_post",
             response_model=VonageInboundAnswer, responses=INBOUND_ERRORS,
             dependencies=[Depends(VONAGE_SIGNATURE)], openapi_extra=VONAGE_BODY)
async def vonage_inbound(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """A text to one of the account's numbers (GET query, form or JSON POST); STOP and
    START change consent before the answer; ``403`` as for receipts."""
    settings = runtime.settings
    params = await vonage_params(request)
    verified(runtime, "vonage", lambda config: vonage_signature.check_receipt(
        config, settings.provider_webhook_max_age, params, time.time()))
    try:
        sms = inbound_sms(params, settings.vonage.provider_id)
    except ValueError as exc:
        raise bad_request("unknown_callback", str(exc)) from None
    await take_inbound(runtime.preferences(), settings, sms,
                       account_numbers(settings.vonage.from_name))
    return JSONResponse({"keyword": sms.keyword.value if sms.keyword else None})


ROUTES: Final = ReceiptRoutes(router, MAX_BODY)
