"""The API's SES receipt route, ``POST /webhooks/ses``: Amazon SES events delivered by an SNS
HTTPS subscription.

Every post is checked before anything is done with it: from a configured topic
(``ses.sns_topic_arns``), its ``SigningCertURL`` on an SNS host, its ``Timestamp`` within
``ses.sns_max_age`` of now, its signature verified with that certificate's key
(``providers/ses/sns.py``; ``SignatureVersion`` 2, SHA-256, and 1 only when
``ses.sns_signature_v1`` allows SHA-1); otherwise ``403``. Then:

- ``SubscriptionConfirmation``: its ``SubscribeURL`` (an SNS host, this topic) is visited,
  which confirms the subscription;
- ``Notification``: the SES event it carries becomes at most one receipt on
  ``notify.receipts``, confirmed by the broker before the ``200``; an event SES would not
  mend by sending again (malformed) is logged and counted, not refused;
- ``UnsubscribeConfirmation``: logged; nothing else.

A certificate or confirmation SNS did not serve, or a receipt Kafka did not acknowledge, is a
``503``: SNS delivers the message again, and the reconciler drops a receipt seen twice by
``(provider_id, provider_event_id)`` (the SNS ``MessageId``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ValidationError

from notiflow.adapters.providers.base import ReceiptRoutes
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.errors import ApiError, bad_request
from notiflow.gateway.openapi import raw_body
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.webhook_openapi import webhook_errors
from notiflow.gateway.webhooks import precheck, publish, read_body, refused
from notiflow.providers.ses import receipts as ses_receipts
from notiflow.providers.ses import sns
from notiflow.providers.ses.config import SesSettings
from notiflow.providers.ses.sns_http import SnsUnreachable

SNS_SIGNATURE: Final = APIKeyHeader(
    name="x-amz-sns-message-type", scheme_name="SnsSignature", auto_error=False,
    description="SNS signs the body itself: `Signature` (RSA, SHA-256 for `SignatureVersion` "
                "2; SHA-1 for 1 only where `ses.sns_signature_v1` allows it) over the "
                "message's fields, checked with the key of the certificate at "
                "`SigningCertURL`, which must be on an SNS host; the message must come from a "
                "configured topic, its `Timestamp` within `ses.sns_max_age` of now. The "
                "header names the message type.")


class SesAnswer(BaseModel):
    receipts: int
    malformed: int
    ignored: int
    confirmed: bool
    """A ``SubscriptionConfirmation`` was confirmed."""


_SNS_COMMON: Final = ("Type", "MessageId", "TopicArn", "Message", "Timestamp",
                      "SignatureVersion", "Signature", "SigningCertURL")


_SNS_FIELDS: Final[dict[str, Any]] = {
    **{name: {"type": "string"} for name in _SNS_COMMON},
    "SignatureVersion": {"type": "string", "enum": ["1", "2"]},
    "Subject": {"type": "string"}, "Token": {"type": "string"},
    "SubscribeURL": {"type": "string"}, "UnsubscribeURL": {"type": "string"}}


SES_BODY: Final = raw_body(
    "An SNS HTTP delivery: a notification whose `Message` is an SES event (JSON text), or "
    "a subscription (un)confirmation. SNS labels it `text/plain`; it is read as JSON "
    "whatever its content type.", {"application/json": {"schema": {"oneOf": [
        {"type": "object", "required": list(_SNS_COMMON), "properties": {
            **_SNS_FIELDS, "Type": {"const": "Notification"}}},
        {"type": "object", "required": [*_SNS_COMMON, "Token", "SubscribeURL"],
         "properties": {**_SNS_FIELDS, "Type": {"enum": ["SubscriptionConfirmation",
                                                         "UnsubscribeConfirmation"]}}}]}}})


log = logging.getLogger("notiflow.gateway.ses_webhook")
router = APIRouter()

MAX_SNS_BODY: Final = 512 * 1024
"""SNS messages are at most 256 KiB; the envelope and JSON escaping add to that."""
RETRY_AFTER_S: Final = 5


def unreachable(exc: SnsUnreachable) -> ApiError:
    log.warning("sns: %s", exc)
    return ApiError(503, "unavailable", "sns_unreachable", str(exc),
                    headers={"Retry-After": str(RETRY_AFTER_S)})


async def authentic(runtime: Runtime, config: SesSettings, raw: bytes) -> sns.SnsMessage:
    """The SNS message of a post, checked: ``400`` when it is not one, ``403`` unless from a
    configured topic and signed by SNS, ``503`` when the certificate cannot be fetched."""
    try:
        msg = sns.parse_envelope(orjson.loads(raw))
    except orjson.JSONDecodeError:
        raise bad_request("invalid_json", "the body is not JSON") from None
    except ValueError as exc:
        raise bad_request("not_sns", str(exc)) from None
    try:
        sns.check_topic(msg, config.sns_topic_arns)
        sns.check_url(msg.signing_cert_url, config.sns_host_pattern,
                      require_https=config.sns_require_https, pem=True)
        sns.check_fresh(msg, datetime.now(UTC), config.sns_max_age)
        sns.verify(msg, await runtime.sns().public_key(msg.signing_cert_url),
                   sha1=config.sns_signature_v1)
    except WebhookRefused as exc:
        raise refused(exc) from None
    except SnsUnreachable as exc:
        raise unreachable(exc) from None
    return msg


@router.post("/webhooks/ses", response_model=SesAnswer,
             responses=webhook_errors(
                 400, 413, r400="`invalid_json`, `not_sns` (not an SNS message).",
                 r413="Bodies are limited to 512 KiB.",
                 r503="`sns_unreachable` (the signing certificate or the subscription "
                      "confirmation was not served), `kafka_unavailable`: SNS delivers the "
                      "message again."),
             openapi_extra=SES_BODY, dependencies=[Depends(SNS_SIGNATURE)])
async def ses_events(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """One SNS delivery: a confirmation is confirmed, a notification's SES event becomes at
    most one receipt."""
    config = runtime.settings.ses
    precheck(lambda: sns.check_headers(
        {arn for s in runtime.keyring.sections("ses") for arn in s.sns_topic_arns},
        request.headers))
    raw = await read_body(request, MAX_SNS_BODY)
    msg = await authentic(runtime, config, raw)
    answer = SesAnswer(receipts=0, malformed=0, ignored=0, confirmed=False)
    if msg.type == sns.SUBSCRIPTION_CONFIRMATION:
        try:
            url = sns.check_subscribe_url(msg, config.sns_host_pattern,
                                          require_https=config.sns_require_https)
            await runtime.sns().confirm(url)
        except WebhookRefused as exc:
            raise refused(exc) from None
        except SnsUnreachable as exc:
            raise unreachable(exc) from None
        log.info("sns: subscription to %s confirmed", msg.topic_arn)
        answer.confirmed = True
    elif msg.type == sns.UNSUBSCRIBE_CONFIRMATION:
        log.warning("sns: %s unsubscribed this endpoint; SES events stop until it is "
                    "subscribed again", msg.topic_arn)
        answer.ignored = 1
    else:
        try:
            event = ses_receipts.decode(msg.message)
            receipt = ses_receipts.event_receipt(event, config.provider_id, msg.message_id,
                                                 datetime.now(UTC))
        except (ValueError, ValidationError) as exc:
            log.warning("sns: SES event %s malformed and skipped (%s)", msg.message_id,
                        type(exc).__name__ if isinstance(exc, ValidationError) else exc)
            answer.malformed = 1
            return JSONResponse(answer.model_dump())
        if receipt is None:
            answer.ignored = 1
        else:
            await publish(runtime, [receipt], [event.traceparent])
            answer.receipts = 1
    return JSONResponse(answer.model_dump())


ROUTES: Final = ReceiptRoutes(router, MAX_SNS_BODY)
