"""Vonage's signed delivery receipts: the ``sig`` algorithm (MD5 hash or HMAC of the sorted
parameters with the signature secret) and the gateway's check of one receipt (pure)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Final, Literal

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.providers.vonage.config import VonageSettings

SignatureMethod = Literal["md5hash", "md5", "sha1", "sha256", "sha512"]
SIGNATURE_METHODS: Final[tuple[SignatureMethod, ...]] = ("md5hash", "md5", "sha1", "sha256",
                                                         "sha512")
DEFAULT_SIGNATURE_METHOD: Final[SignatureMethod] = "sha256"
"""The account's signature method this platform expects ("SHA-256 HMAC" in the dashboard)."""
SIGNATURE_MAX_SKEW_S: Final = 300


def signature_base(params: Mapping[str, str]) -> str:
    """The signed string: ``&name=value`` for every parameter except ``sig``, sorted by name,
    with ``&`` and ``=`` in values replaced by ``_``."""
    return "".join(f"&{name}={params[name].replace('&', '_').replace('=', '_')}"
                   for name in sorted(params) if name != "sig")


def signature(secret: str, params: Mapping[str, str],
              method: SignatureMethod = DEFAULT_SIGNATURE_METHOD) -> str:
    """Vonage's ``sig`` of ``params``: lowercase hex MD5 of the base string followed by the
    secret (``md5hash``), or uppercase hex HMAC of the base string keyed by the secret."""
    base = signature_base(params).encode()
    if method == "md5hash":
        return hashlib.md5(base + secret.encode(), usedforsecurity=False).hexdigest()
    if method not in SIGNATURE_METHODS:
        raise ValueError(f"unknown signature method {method!r}")
    return hmac.new(secret.encode(), base, method).hexdigest().upper()


def verify_signature(secret: str, params: Mapping[str, str], *,
                     method: SignatureMethod = DEFAULT_SIGNATURE_METHOD,
                     now: float | None = None, max_skew_s: float = SIGNATURE_MAX_SKEW_S) -> bool:
    """True when ``params`` carry a valid ``sig`` and a ``timestamp`` (Unix seconds) within
    ``max_skew_s`` of ``now``; the hex comparison ignores case and runs in constant time."""
    given = params.get("sig")
    stamp = params.get("timestamp", "")
    if not given or not stamp.isdigit():
        return False
    if abs(int(stamp) - (time.time() if now is None else now)) > max_skew_s:
        return False
    expected = signature(secret, params, method)
    return hmac.compare_digest(expected.lower().encode(), given.lower().encode())


def check_receipt(config: VonageSettings, max_age: timedelta, params: Mapping[str, str],
                  now: float) -> None:
    """Raise :class:`WebhookRefused` unless the receipt is of this account (``api-key``) and
    carries a valid ``sig`` with a ``timestamp`` within ``max_age`` of ``now`` (Unix
    seconds). Without a configured signature secret every receipt is refused
    (``signature_not_configured``): an unsigned receipt could be anyone's."""
    given_key = params.get("api-key")
    if config.api_key and given_key and not hmac.compare_digest(given_key.encode(),
                                                                config.api_key.encode()):
        raise WebhookRefused("wrong_account", "the receipt names another Vonage account")
    secret = config.signature_secret
    if secret is None or not secret.get_secret_value():
        raise WebhookRefused("signature_not_configured",
                             "no Vonage signature secret is configured")
    if not params.get("sig"):
        raise WebhookRefused("missing_signature", "sig is required")
    stamp = params.get("timestamp", "")
    if not stamp.isdigit() or abs(now - int(stamp)) > max_age.total_seconds():
        raise WebhookRefused("stale_timestamp",
                             f"timestamp is not within {int(max_age.total_seconds())} s of now")
    if not verify_signature(secret.get_secret_value(), params, now=now,
                            max_skew_s=max_age.total_seconds()):
        raise WebhookRefused("invalid_signature", "sig does not match this receipt")
