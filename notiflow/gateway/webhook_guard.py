"""What a provider webhook post must show before its body is read (pure).

The signature of a receipt covers its body, so it can only be verified once the body is in;
these checks look at what comes first (the receiver being configured, the signature headers
present and shaped as the provider sends them, a fresh timestamp, the SNS topic header), so
that a post no provider sent is refused ``403`` for the price of its headers. The full check
(``providers/*/signature.py``) still runs on the body afterwards.

Each function takes the provider account's settings sections in force (current, then those of
an open rotation window) and raises :class:`WebhookRefused` with the reason the full check
would give.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.providers.sendgrid import signature as sendgrid_signature
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.ses import sns
from notiflow.providers.ses.config import SesSettings
from notiflow.providers.twilio import signature as twilio_signature
from notiflow.providers.twilio.config import TwilioSettings

TWILIO_SIGNATURE: Final = twilio_signature.SIGNATURE_HEADER
SENDGRID_SIGNATURE: Final = sendgrid_signature.EVENT_SIGNATURE_HEADER
SENDGRID_TIMESTAMP: Final = sendgrid_signature.EVENT_TIMESTAMP_HEADER
TWILIO_SHAPE: Final = re.compile(r"[A-Za-z0-9+/]{27}=")
"""Base64 of an HMAC-SHA1 (20 bytes)."""
SENDGRID_SHAPE: Final = re.compile(r"[A-Za-z0-9+/]{64,128}={0,2}")
"""Base64 of a DER ECDSA P-256 signature (70 to 72 bytes; some slack either way)."""
TIMESTAMP_SHAPE: Final = re.compile(r"[0-9]{1,12}")
SNS_TOPIC: Final = "x-amz-sns-topic-arn"
SNS_TYPES: Final = frozenset({sns.NOTIFICATION, sns.SUBSCRIPTION_CONFIRMATION,
                              sns.UNSUBSCRIBE_CONFIRMATION})


def twilio_headers(sections: Sequence[TwilioSettings], headers: Mapping[str, str]) -> None:
    """An auth token is configured and ``X-Twilio-Signature`` looks like one."""
    if not any(s.auth_token is not None for s in sections):
        raise WebhookRefused("invalid_signature", "no Twilio auth token is configured")
    if not TWILIO_SHAPE.fullmatch(headers.get(TWILIO_SIGNATURE) or ""):
        raise WebhookRefused("invalid_signature",
                             f"{TWILIO_SIGNATURE} does not match this request")


def sendgrid_headers(sections: Sequence[SendGridSettings], headers: Mapping[str, str],
                     max_age: timedelta, now: float) -> None:
    """A verification key is configured, both signature headers are present and shaped, and
    the timestamp is within ``max_age`` of ``now`` (Unix seconds)."""
    if not any(s.event_webhook_public_key for s in sections):
        raise WebhookRefused("signature_not_configured",
                             "no Event Webhook verification key is configured")
    signature = headers.get(SENDGRID_SIGNATURE)
    stamp = headers.get(SENDGRID_TIMESTAMP)
    if not signature or not stamp:
        raise WebhookRefused("missing_signature", f"{SENDGRID_SIGNATURE} and "
                                                  f"{SENDGRID_TIMESTAMP} are required")
    if not TIMESTAMP_SHAPE.fullmatch(stamp) or abs(now - int(stamp)) > max_age.total_seconds():
        raise WebhookRefused("stale_timestamp", f"{SENDGRID_TIMESTAMP} is not within "
                                                f"{int(max_age.total_seconds())} s of now")
    if not SENDGRID_SHAPE.fullmatch(signature):
        raise WebhookRefused("invalid_signature",
                             f"{SENDGRID_SIGNATURE} does not match this request")


def sns_headers(sections: Sequence[SesSettings], headers: Mapping[str, str]) -> None:
    """A topic is configured, and the topic SNS names in ``x-amz-sns-topic-arn`` (when sent)
    is one of them, and ``x-amz-sns-message-type`` (when sent) is a type SNS sends
    (``not_sns``)."""
    topics = {arn for s in sections for arn in s.sns_topic_arns}
    if not topics:
        raise WebhookRefused("webhook_not_configured",
                             "no SNS topic is configured (ses.sns_topic_arns)")
    topic = headers.get(SNS_TOPIC)
    if topic is not None and topic not in topics:
        raise WebhookRefused("wrong_account", "the message is from a topic not configured")
    kind = headers.get(sns.TYPE_HEADER)
    if kind is not None and kind not in SNS_TYPES:
        raise WebhookRefused("not_sns", f"{sns.TYPE_HEADER} is not a message type SNS sends")
