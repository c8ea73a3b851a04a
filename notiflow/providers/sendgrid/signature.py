"""SendGrid's signed Event Webhook: the ECDSA P-256 / SHA-256 signature over the timestamp
header and the raw body, and the gateway's check of one post (pure but for a cache of parsed
verification keys)."""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.providers.sendgrid.config import SendGridSettings

log = logging.getLogger(__name__)

EVENT_SIGNATURE_HEADER: Final = "X-Twilio-Email-Event-Webhook-Signature"
EVENT_TIMESTAMP_HEADER: Final = "X-Twilio-Email-Event-Webhook-Timestamp"


def event_signature(key: ec.EllipticCurvePrivateKey, timestamp: str, payload: bytes) -> str:
    """``X-Twilio-Email-Event-Webhook-Signature`` of an Event Webhook post: base64 of the DER
    ECDSA P-256 / SHA-256 signature over the timestamp header followed by the raw body."""
    return base64.b64encode(
        key.sign(timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))).decode()


def load_event_public_key(text: str) -> ec.EllipticCurvePublicKey:
    """The verification key SendGrid shows: base64 DER SubjectPublicKeyInfo (PEM accepted)."""
    if "BEGIN PUBLIC KEY" in text:
        key = serialization.load_pem_public_key(text.encode())
    else:
        key = serialization.load_der_public_key(base64.b64decode(text))
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("the Event Webhook verification key is not an EC public key")
    return key


def verify_event_signature(public_key: ec.EllipticCurvePublicKey | str, payload: bytes,
                           signature: str | None, timestamp: str | None) -> bool:
    """True when ``signature`` is SendGrid's signature of ``timestamp`` + ``payload`` (the raw
    request body, byte for byte)."""
    if not signature or not timestamp:
        return False
    try:
        key = (load_event_public_key(public_key) if isinstance(public_key, str)
               else public_key)
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode() + payload,
                   ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


@functools.lru_cache(maxsize=8)
def _configured_key(text: str) -> ec.EllipticCurvePublicKey | None:
    try:
        return load_event_public_key(text)
    except (ValueError, TypeError):
        log.error("sendgrid.event_webhook_public_key is not a usable EC public key")
        return None


def check_event_post(config: SendGridSettings, max_age: timedelta,
                     headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Raise :class:`WebhookRefused` unless ``body`` carries SendGrid's signature over the
    timestamp header and body, and that timestamp is within ``max_age`` of ``now`` (Unix
    seconds)."""
    key = (_configured_key(config.event_webhook_public_key)
           if config.event_webhook_public_key else None)
    if key is None:
        raise WebhookRefused("signature_not_configured",
                             "no Event Webhook verification key is configured")
    signature, stamp = _fresh_signature(headers, max_age, now)
    if not verify_event_signature(key, body, signature, stamp):
        raise WebhookRefused("invalid_signature", f"{EVENT_SIGNATURE_HEADER} does not match "
                                                  "this request")


SIGNATURE_SHAPE: Final = re.compile(r"[A-Za-z0-9+/]{64,128}={0,2}")
"""Base64 of a DER ECDSA P-256 signature (70 to 72 bytes; some slack either way)."""
TIMESTAMP_SHAPE: Final = re.compile(r"[0-9]{1,12}")


def check_headers(sections: Sequence[SendGridSettings], headers: Mapping[str, str],
                  max_age: timedelta, now: float) -> None:
    """Before the body is read: a verification key is configured (in one of ``sections``,
    the account's sections in force), both signature headers are present and shaped, and
    the timestamp is within ``max_age`` of ``now`` (Unix seconds)."""
    if not any(s.event_webhook_public_key for s in sections):
        raise WebhookRefused("signature_not_configured",
                             "no Event Webhook verification key is configured")
    signature, _stamp = _fresh_signature(headers, max_age, now)
    if not SIGNATURE_SHAPE.fullmatch(signature):
        raise WebhookRefused("invalid_signature",
                             f"{EVENT_SIGNATURE_HEADER} does not match this request")


def _fresh_signature(headers: Mapping[str, str], max_age: timedelta,
                     now: float) -> tuple[str, str]:
    """(signature, timestamp) of the signature headers, both present and the timestamp
    within ``max_age`` of ``now`` (Unix seconds)."""
    signature = headers.get(EVENT_SIGNATURE_HEADER)
    stamp = headers.get(EVENT_TIMESTAMP_HEADER)
    if not signature or not stamp:
        raise WebhookRefused("missing_signature", f"{EVENT_SIGNATURE_HEADER} and "
                                                  f"{EVENT_TIMESTAMP_HEADER} are required")
    if not TIMESTAMP_SHAPE.fullmatch(stamp) or abs(now - int(stamp)) > max_age.total_seconds():
        raise WebhookRefused("stale_timestamp", f"{EVENT_TIMESTAMP_HEADER} is not within "
                                                f"{int(max_age.total_seconds())} s of now")
    return signature, stamp
