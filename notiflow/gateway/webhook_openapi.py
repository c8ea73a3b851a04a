"""The provider webhooks in the OpenAPI document: how each authenticates (the provider's
signature, not a tenant token), what it receives and answers. Used by ``webhooks.py``."""

from __future__ import annotations

from typing import Any, Final

from fastapi.security import APIKeyHeader, APIKeyQuery, HTTPBearer
from pydantic import BaseModel

from notiflow.gateway.openapi import Responses, errors, raw_body

TWILIO_SIGNATURE: Final = APIKeyHeader(
    name="X-Twilio-Signature", scheme_name="TwilioSignature", auto_error=False,
    description="HMAC-SHA1 of the callback URL and form parameters with the account's auth "
                "token (Twilio's request validation).")
SENDGRID_SIGNATURE: Final = APIKeyHeader(
    name="X-Twilio-Email-Event-Webhook-Signature", scheme_name="SendGridSignature",
    auto_error=False,
    description="ECDSA P-256 signature over `X-Twilio-Email-Event-Webhook-Timestamp` and the "
                "raw body, checked with the Event Webhook's public key.")
VONAGE_SIGNATURE: Final = APIKeyQuery(
    name="sig", scheme_name="VonageSignature", auto_error=False,
    description="SHA-256 HMAC of the other parameters with the signature secret (in the "
                "query, form or JSON body); without a configured secret every receipt is "
                "refused.")
SNS_SIGNATURE: Final = APIKeyHeader(
    name="x-amz-sns-message-type", scheme_name="SnsSignature", auto_error=False,
    description="SNS signs the body itself: `Signature` (RSA, SHA-256 for `SignatureVersion` "
                "2; SHA-1 for 1 only where `ses.sns_signature_v1` allows it) over the "
                "message's fields, checked with the key of the certificate at "
                "`SigningCertURL`, which must be on an SNS host; the message must come from a "
                "configured topic, its `Timestamp` within `ses.sns_max_age` of now. The "
                "header names the message type.")
DSN_SECRET: Final = HTTPBearer(
    scheme_name="DsnWebhookSecret", auto_error=False,
    description="`smtp.dsn_webhook_secret` (the relay's mail pipe cannot sign).")


class SendgridAnswer(BaseModel):
    receipts: int
    malformed: int
    ignored: int


class VonageAnswer(BaseModel):
    receipts: int


class SesAnswer(BaseModel):
    receipts: int
    malformed: int
    ignored: int
    confirmed: bool
    """A ``SubscriptionConfirmation`` was confirmed."""


class DsnAnswer(BaseModel):
    receipts: int
    ignored: int


_FORM: Final = "application/x-www-form-urlencoded"
_FLAT: Final[dict[str, Any]] = {"type": "object",
                                "additionalProperties": {"type": "string"}}

TWILIO_BODY: Final = raw_body("A Twilio status callback.", {_FORM: {"schema": {
    **_FLAT, "properties": {"MessageSid": {"type": "string"},
                            "MessageStatus": {"type": "string"},
                            "ErrorCode": {"type": "string"}}}}})
SENDGRID_BODY: Final = raw_body("An Event Webhook batch.", {"application/json": {"schema": {
    "type": "array", "items": {"type": "object"}}}})
VONAGE_BODY: Final = {"requestBody": {**raw_body("A delivery receipt (or in the query).", {
    _FORM: {"schema": _FLAT}, "application/json": {"schema": _FLAT}})["requestBody"],
    "required": False}}
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
DSN_BODY: Final = raw_body("An RFC 3464 delivery status notification, raw.", {
    "message/rfc822": {"schema": {"type": "string"}},
    "multipart/report": {"schema": {"type": "string"}}})

_REFUSED: Final = ("`invalid_signature`, `missing_signature`, `stale_timestamp`, "
                   "`signature_not_configured`, `wrong_account`, `invalid_token`, "
                   "`webhook_not_configured`, `untrusted_url`: nothing was written.")
_PUBLISH: Final = "`kafka_unavailable`: the provider retries the whole post."


def webhook_errors(*codes: int, **reasons: str) -> Responses:
    """The errors of a webhook receiver: 403 for an unsigned or forged post, 503 when
    Kafka does not confirm the receipts, and ``codes``."""
    return errors(*sorted({*codes, 403, 503}), **{"r403": _REFUSED, "r503": _PUBLISH, **reasons})
