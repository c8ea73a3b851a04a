"""``X-Twilio-Signature`` of Twilio's webhooks (status callbacks, incoming messages):
computing, verifying, and the gateway's check of one callback (pure)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.providers.twilio.config import TwilioSettings

SIGNATURE_HEADER: Final = "X-Twilio-Signature"


def signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """``X-Twilio-Signature`` of a webhook: base64(HMAC-SHA1(auth token, full URL followed by
    every POST parameter name and value, sorted by name, without separators))."""
    payload = url + "".join(name + params[name] for name in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def verify_signature(auth_token: str, url: str, params: Mapping[str, str],
                     header: str | None) -> bool:
    """True when ``header`` is the signature Twilio computes for this request (constant time)."""
    if not header:
        return False
    return hmac.compare_digest(signature(auth_token, url, params).encode(),
                               header.encode(errors="surrogateescape"))


def signed_url(request_url: str, configured: str | None) -> str:
    """The URL Twilio signed: the configured public callback URL (scheme, host, path) with the
    request's query, or the request URL itself when none is configured."""
    if not configured:
        return request_url
    base = urlsplit(configured)
    query = urlsplit(request_url).query
    return f"{base.scheme}://{base.netloc}{base.path}" + (f"?{query}" if query else "")


def check_callback(config: TwilioSettings, request_url: str, params: Mapping[str, str],
                   header: str | None, *, inbound: bool = False) -> None:
    """Raise :class:`WebhookRefused` unless ``header`` is the account's signature of this
    callback (``request_url`` as received, ``params`` its form body): a status callback, or
    with ``inbound`` a text sent to one of the account's numbers (signed over the number's
    configured ``inbound_url``)."""
    token = config.auth_token
    url = signed_url(request_url, config.inbound_url if inbound else config.status_callback_url)
    if token is None or not verify_signature(token.get_secret_value(), url, params, header):
        raise WebhookRefused("invalid_signature",
                             f"{SIGNATURE_HEADER} does not match this request")


SIGNATURE_SHAPE: Final = re.compile(r"[A-Za-z0-9+/]{27}=")
"""Base64 of an HMAC-SHA1 (20 bytes)."""


def check_headers(sections: Sequence[TwilioSettings], headers: Mapping[str, str]) -> None:
    """Before the body is read: an auth token is configured (in one of ``sections``, the
    account's sections in force) and ``X-Twilio-Signature`` looks like one."""
    if not any(s.auth_token is not None for s in sections):
        raise WebhookRefused("invalid_signature", "no Twilio auth token is configured")
    if not SIGNATURE_SHAPE.fullmatch(headers.get(SIGNATURE_HEADER) or ""):
        raise WebhookRefused("invalid_signature",
                             f"{SIGNATURE_HEADER} does not match this request")
