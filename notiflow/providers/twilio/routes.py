"""The API's Twilio routes, both signed with ``X-Twilio-Signature``: ``POST /webhooks/twilio``,
status callbacks (the shared HTTP side is :mod:`notiflow.gateway.webhooks`), and
``POST /webhooks/twilio/inbound``, texts people send to the account's numbers, whose STOP,
START and HELP change consent (:mod:`notiflow.gateway.inbound_sms`) and are answered in
TwiML."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import APIKeyHeader

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import bad_request
from notiflow.gateway.inbound_sms import take_inbound
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.webhook_openapi import FLAT_OBJECT, FORM, webhook_errors
from notiflow.gateway.webhooks import MAX_BODY, precheck, publish, read_body, verified
from notiflow.providers.twilio import receipts as twilio_receipts
from notiflow.providers.twilio import signature as twilio_signature
from notiflow.sms_keywords import InboundSms, keyword_of

TWILIO_SIGNATURE: Final = APIKeyHeader(
    name="X-Twilio-Signature", scheme_name="TwilioSignature", auto_error=False,
    description="HMAC-SHA1 of the callback URL and form parameters with the account's auth "
                "token (Twilio's request validation).")


TWILIO_BODY: Final = raw_body("A Twilio status callback.", {FORM: {"schema": {
    **FLAT_OBJECT, "properties": {"MessageSid": {"type": "string"},
                            "MessageStatus": {"type": "string"},
                            "ErrorCode": {"type": "string"}}}}})


router = APIRouter()


async def signed_form(request: Request, runtime: Runtime, *, inbound: bool) -> dict[str, str]:
    """The form a Twilio webhook posted, once its ``X-Twilio-Signature`` is checked (the
    headers before the body is read, then the whole request); ``403`` otherwise."""
    precheck(lambda: twilio_signature.check_headers(runtime.keyring.sections("twilio"),
                                                    request.headers))
    raw = await read_body(request, MAX_BODY)
    params = dict(parse_qsl(raw.decode(errors="replace"), keep_blank_values=True))
    verified(runtime, "twilio", lambda config: twilio_signature.check_callback(
        config, str(request.url), params,
        request.headers.get(twilio_signature.SIGNATURE_HEADER), inbound=inbound))
    return params


@router.post("/webhooks/twilio",
             responses={200: {"description": "Taken (empty body)."},
                        **webhook_errors(400, 413, r400="`unknown_callback`.")},
             openapi_extra=TWILIO_BODY, dependencies=[Depends(TWILIO_SIGNATURE)])
async def twilio_status(request: Request, runtime: RuntimeDep) -> Response:
    """One Twilio status callback → at most one receipt; ``403`` unless signed."""
    settings = runtime.settings
    params = await signed_form(request, runtime, inbound=False)
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


TWILIO_INBOUND_BODY: Final = raw_body("A text sent to one of the account's numbers.", {FORM: {
    "schema": {**FLAT_OBJECT, "required": ["MessageSid", "From", "To"],
               "properties": {"MessageSid": {"type": "string"}, "From": {"type": "string"},
                              "To": {"type": "string"}, "Body": {"type": "string"},
                              "OptOutType": {"type": "string"}}}}})
TWIML: Final = "application/xml"


def twiml(reply: str | None) -> Response:
    """A TwiML answer: one ``<Message>`` texted back, or nothing."""
    inner = f"<Message>{escape(reply)}</Message>" if reply else ""
    return Response(f'<?xml version="1.0" encoding="UTF-8"?><Response>{inner}</Response>',
                    media_type=TWIML)


def inbound_sms(params: dict[str, str], provider_id: str) -> InboundSms:
    """The text of an incoming-message webhook; ValueError when it is not one."""
    missing = [k for k in ("MessageSid", "From", "To") if not params.get(k)]
    if missing:
        raise ValueError(f"not an incoming message: {', '.join(missing)} missing")
    body = params.get("Body", "")
    return InboundSms(provider_id, params["From"], params["To"], body,
                      keyword_of(body, params.get("OptOutType")))


@router.post("/webhooks/twilio/inbound", response_class=Response,
             responses={200: {"description": "Taken: TwiML, with the reply to text back if "
                                             "any.", "content": {TWIML: {"schema": {
                                                 "type": "string"}}}},
                        **webhook_errors(400, 413, r400="`unknown_callback`.",
                                         r503="`kafka_unavailable`, `cassandra_unavailable`, "
                                              "`preferences_contention`: Twilio may post "
                                              "again; nothing is applied twice.")},
             openapi_extra=TWILIO_INBOUND_BODY, dependencies=[Depends(TWILIO_SIGNATURE)])
async def twilio_inbound(request: Request, runtime: RuntimeDep) -> Response:
    """A text to one of the account's numbers; STOP, START and HELP change consent before
    the answer; ``403`` unless signed."""
    settings = runtime.settings
    params = await signed_form(request, runtime, inbound=True)
    try:
        sms = inbound_sms(params, settings.twilio.provider_id)
    except ValueError as exc:
        raise bad_request("unknown_callback", str(exc)) from None
    reply = await take_inbound(runtime.preferences(), settings, sms,
                               (settings.twilio.from_number,))
    return twiml(reply)


ROUTES: Final = ReceiptRoutes(router, MAX_BODY)
