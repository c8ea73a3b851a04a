"""The API's Twilio receipt route: ``POST /webhooks/twilio``, status callbacks signed with
``X-Twilio-Signature`` (the shared HTTP side is :mod:`notiflow.gateway.webhooks`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import APIKeyHeader

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import bad_request
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.webhook_openapi import FLAT_OBJECT, FORM, webhook_errors
from notiflow.gateway.webhooks import MAX_BODY, precheck, publish, read_body, verified
from notiflow.providers.twilio import receipts as twilio_receipts
from notiflow.providers.twilio import signature as twilio_signature

TWILIO_SIGNATURE: Final = APIKeyHeader(
    name="X-Twilio-Signature", scheme_name="TwilioSignature", auto_error=False,
    description="HMAC-SHA1 of the callback URL and form parameters with the account's auth "
                "token (Twilio's request validation).")


TWILIO_BODY: Final = raw_body("A Twilio status callback.", {FORM: {"schema": {
    **FLAT_OBJECT, "properties": {"MessageSid": {"type": "string"},
                            "MessageStatus": {"type": "string"},
                            "ErrorCode": {"type": "string"}}}}})


router = APIRouter()


@router.post("/webhooks/twilio",
             responses={200: {"description": "Taken (empty body)."},
                        **webhook_errors(400, 413, r400="`unknown_callback`.")},
             openapi_extra=TWILIO_BODY, dependencies=[Depends(TWILIO_SIGNATURE)])
async def twilio_status(request: Request, runtime: RuntimeDep) -> Response:
    """One Twilio status callback → at most one receipt; ``403`` unless signed."""
    settings = runtime.settings
    precheck(lambda: twilio_signature.check_headers(runtime.keyring.sections("twilio"),
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


ROUTES: Final = ReceiptRoutes(router, MAX_BODY)
