"""Amazon SNS HTTP(S) deliveries: the message envelope, its signature and where its signing
certificate may come from (pure; the certificate is fetched by ``sns_http.py``).

SNS signs the canonical string of a message's fields (``Message``, ``MessageId``,
``Subject`` when present, ``SubscribeURL`` and ``Token`` for (un)subscription confirmations,
``Timestamp``, ``TopicArn``, ``Type``, each as ``name\\nvalue\\n``) with RSA PKCS#1 v1.5:
SHA-1 for ``SignatureVersion`` 1, SHA-256 for 2; version 1 is verified only when the caller
allows SHA-1, and a message is taken only within a freshness window of its ``Timestamp``
(:func:`check_fresh`: a captured delivery cannot be replayed later). The certificate is
trusted for where it lives, not for its chain: ``SigningCertURL`` (and ``SubscribeURL``)
must be HTTPS on a host of SNS (``sns.<region>.amazonaws.com``), a ``.pem`` file with no user
info.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from notiflow.adapters.providers.webhook import WebhookRefused

NOTIFICATION: Final = "Notification"
SUBSCRIPTION_CONFIRMATION: Final = "SubscriptionConfirmation"
UNSUBSCRIBE_CONFIRMATION: Final = "UnsubscribeConfirmation"
TYPE_HEADER: Final = "x-amz-sns-message-type"


_SIGNED_FIELDS: Final = {
    NOTIFICATION: ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    SUBSCRIPTION_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                                "TopicArn", "Type"),
    UNSUBSCRIBE_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token",
                               "TopicArn", "Type"),
}
HASHES: Final[dict[str, type[hashes.HashAlgorithm]]] = {"1": hashes.SHA1, "2": hashes.SHA256}
"""``SignatureVersion`` → the digest signed."""


@dataclass(frozen=True, slots=True)
class SnsMessage:
    """One SNS delivery as posted (the body's JSON object, its strings kept as sent)."""

    fields: dict[str, str]

    @property
    def type(self) -> str:
        return self.fields["Type"]

    @property
    def message_id(self) -> str:
        return self.fields["MessageId"]

    @property
    def topic_arn(self) -> str:
        return self.fields["TopicArn"]

    @property
    def message(self) -> str:
        return self.fields["Message"]

    @property
    def signing_cert_url(self) -> str:
        return self.fields["SigningCertURL"]

    @property
    def subscribe_url(self) -> str | None:
        return self.fields.get("SubscribeURL")


def parse_envelope(doc: Any) -> SnsMessage:
    """The SNS message of a decoded body; ``ValueError`` when it is not one (a field its
    type signs, or the signature's, missing or not a string)."""
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    kind = doc.get("Type")
    if not isinstance(kind, str) or kind not in _SIGNED_FIELDS:
        raise ValueError(f"unknown SNS message type {kind!r}")
    required = [f for f in _SIGNED_FIELDS[kind] if f != "Subject"]
    required += ["Signature", "SignatureVersion", "SigningCertURL"]
    missing = [f for f in required if not isinstance(doc.get(f), str)]
    if missing:
        raise ValueError(f"{kind} without {', '.join(missing)}")
    return SnsMessage({k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)})


def string_to_sign(msg: SnsMessage) -> bytes:
    """The canonical text SNS signs for ``msg``'s type (absent optional fields left out)."""
    parts = [f"{name}\n{msg.fields[name]}\n" for name in _SIGNED_FIELDS[msg.type]
             if name in msg.fields]
    return "".join(parts).encode()


def check_url(url: str, host_pattern: str, *, require_https: bool = True,
              pem: bool = False) -> None:
    """:class:`WebhookRefused` unless ``url`` is on a host ``host_pattern`` matches whole
    (HTTPS unless ``require_https`` is false, no user info; a ``.pem`` path if ``pem``)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _ = parts.port
    except ValueError:
        raise WebhookRefused("untrusted_url", "the URL does not parse") from None
    schemes = ("https",) if require_https else ("https", "http")
    if (parts.scheme not in schemes or parts.username is not None
            or parts.password is not None or not re.fullmatch(host_pattern, host)):
        raise WebhookRefused("untrusted_url", f"{parts.scheme}://{host} is not an SNS "
                                              f"endpoint")
    if pem and not parts.path.endswith(".pem"):
        raise WebhookRefused("untrusted_url", "the signing certificate URL is not a .pem file")


def check_subscribe_url(msg: SnsMessage, host_pattern: str, *,
                        require_https: bool = True) -> str:
    """The ``SubscribeURL`` of a confirmation, checked like the certificate's URL and naming
    ``Action=ConfirmSubscription`` for the message's topic."""
    url = msg.subscribe_url
    if url is None:
        raise WebhookRefused("untrusted_url", "no SubscribeURL")
    check_url(url, host_pattern, require_https=require_https)
    query = parse_qs(urlsplit(url).query)
    if query.get("Action") != ["ConfirmSubscription"] or query.get("TopicArn") != [
            msg.topic_arn]:
        raise WebhookRefused("untrusted_url", "SubscribeURL does not confirm this topic")
    return url


def check_topic(msg: SnsMessage, topic_arns: tuple[str, ...]) -> None:
    """:class:`WebhookRefused` unless the message is from one of the configured topics."""
    if not topic_arns:
        raise WebhookRefused("webhook_not_configured", "no SNS topic is configured "
                                                       "(ses.sns_topic_arns)")
    if msg.topic_arn not in topic_arns:
        raise WebhookRefused("wrong_account", "the message is from a topic not configured")


def check_fresh(msg: SnsMessage, now: datetime, max_age: timedelta) -> None:
    """:class:`WebhookRefused` unless ``msg``'s ``Timestamp`` (ISO 8601 with an offset) is
    within ``max_age`` of ``now`` (``now`` aware), before or after."""
    try:
        at = datetime.fromisoformat(msg.fields["Timestamp"])
    except (KeyError, ValueError):
        at = None
    if at is None or at.tzinfo is None:
        raise WebhookRefused("stale_message", "the Timestamp is not an ISO 8601 time with "
                                              "an offset")
    if abs(now - at) > max_age:
        raise WebhookRefused("stale_message", f"the message is more than {max_age} away from "
                                              "now (a replay, or a clock far off)")


def verify(msg: SnsMessage, key: rsa.RSAPublicKey, *, sha1: bool = False) -> None:
    """:class:`WebhookRefused` unless ``msg``'s ``Signature`` is ``key``'s over
    :func:`string_to_sign` with its version's digest; ``SignatureVersion`` 1 (SHA-1) only
    when ``sha1`` allows it."""
    version = msg.fields["SignatureVersion"]
    digest = HASHES.get(version)
    if digest is None or (digest is hashes.SHA1 and not sha1):
        raise WebhookRefused("invalid_signature", f"unsupported SignatureVersion {version!r}"
                             + (" (SHA-1 is off: ses.sns_signature_v1)" if digest else ""))
    try:
        signature = base64.b64decode(msg.fields["Signature"], validate=True)
        key.verify(signature, string_to_sign(msg), padding.PKCS1v15(), digest())
    except (InvalidSignature, binascii.Error, ValueError):
        raise WebhookRefused("invalid_signature", "the SNS signature does not verify") from None


def sign(fields: dict[str, str], key: rsa.RSAPrivateKey, version: str = "1") -> str:
    """The base64 ``Signature`` of a message with these fields (what SNS computes; the
    emulator and tests sign with it)."""
    msg = SnsMessage({**fields, "SignatureVersion": version})
    return base64.b64encode(key.sign(string_to_sign(msg), padding.PKCS1v15(),
                                     HASHES[version]())).decode()


TOPIC_HEADER: Final = "x-amz-sns-topic-arn"
TYPES: Final = frozenset({NOTIFICATION, SUBSCRIPTION_CONFIRMATION, UNSUBSCRIBE_CONFIRMATION})


def check_headers(topics: Collection[str], headers: Mapping[str, str]) -> None:
    """Before the body is read: a topic is configured (``topics``), the topic SNS names in
    ``x-amz-sns-topic-arn`` (when sent) is one of them, and ``x-amz-sns-message-type`` (when
    sent) is a type SNS sends (``not_sns``)."""
    if not topics:
        raise WebhookRefused("webhook_not_configured",
                             "no SNS topic is configured (ses.sns_topic_arns)")
    topic = headers.get(TOPIC_HEADER)
    if topic is not None and topic not in topics:
        raise WebhookRefused("wrong_account", "the message is from a topic not configured")
    kind = headers.get(TYPE_HEADER)
    if kind is not None and kind not in TYPES:
        raise WebhookRefused("not_sns", f"{TYPE_HEADER} is not a message type SNS sends")
