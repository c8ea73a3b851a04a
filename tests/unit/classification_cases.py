"""Expected rows the provider classification tests share, written out independently of the
code under test: the HTTP status table of the JSON-over-HTTP providers and the status-class
fallback; the check of a provider's HTTP tables against them; and the messages, keys and one
send through an HTTP client those tests build."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from notiflow.adapters.providers.base import OutboundMessage, Outcome, ProviderClient, SendResult
from notiflow.adapters.providers.common import Rule
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import PushRecipient

T, P, A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

HTTP_DEFAULT_STATUSES: dict[int, tuple[Outcome, str]] = {
    400: (P, "rejected"),
    401: (T, "auth_failed"),
    403: (T, "misconfigured"),
    404: (T, "misconfigured"),
    405: (T, "misconfigured"),
    408: (T, "timeout"),
    413: (P, "invalid_content"),
    429: (T, "rate_limited"),
    500: (A, "server_error"),
    502: (T, "server_error"),
    503: (T, "server_error"),
    504: (A, "gateway_timeout"),
}
"""The reviewed rows of the HTTP status table Twilio, Vonage and FCM share (SendGrid adds two)."""

STATUS_CLASSES: dict[int, tuple[Outcome, str]] = {
    1: (A, "unexpected_status"),
    2: (A, "malformed_response"),
    3: (T, "misconfigured"),
    4: (P, "rejected"),
    5: (T, "server_error"),
}
"""The reviewed ``status // 100`` fallback of the HTTP providers."""


def status_class_cases(*statuses: int,
                       classes: Mapping[int, tuple[Outcome, str]] = STATUS_CLASSES,
                       ) -> list[tuple[int, tuple[Outcome, str]]]:
    """``(status, expected)`` for each status: its class row, AMBIGUOUS ``unexpected_status``
    outside 1xx to 5xx."""
    return [(s, classes.get(s // 100, (A, "unexpected_status"))) for s in statuses]


def assert_http_tables(statuses: Mapping[int, Rule], classes: Mapping[int, Rule],
                       expected: Mapping[int, object] = HTTP_DEFAULT_STATUSES) -> None:
    """A provider's HTTP status table has exactly the reviewed rows ``expected``, and its
    status-class fallback one row for each class from 1xx to 5xx."""
    assert set(statuses) == set(expected), sorted(set(statuses) ^ set(expected))
    assert set(classes) == set(STATUS_CLASSES), sorted(set(classes) ^ set(STATUS_CLASSES))


def outbound(*, channel: Channel, recipient: str | PushRecipient, body: str,
             subject: str | None = None, message_id: str = "msg_1", attempt: int = 1,
             tier: Tier = Tier.P1) -> OutboundMessage:
    """A message of tenant ``acme``: a test binds its provider's defaults with
    :func:`functools.partial` and overrides them by keyword."""
    return OutboundMessage(message_id=message_id, attempt=attempt, tenant_id="acme",
                           channel=channel, tier=tier, recipient=recipient, body=body,
                           subject=subject)


def pkcs8_pem(key: PrivateKeyTypes) -> str:
    """``key`` as an unencrypted PKCS #8 PEM, the form the provider settings take."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def send_once(client_of: Callable[[aiohttp.ClientSession], ProviderClient],
                    message: OutboundMessage) -> SendResult:
    """The result of sending ``message`` once with the client ``client_of`` builds over a
    fresh HTTP session (closed before this returns)."""
    async with aiohttp.ClientSession() as session:
        return await client_of(session).send(message)
