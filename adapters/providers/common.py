"""Helpers shared by the provider adapters: the classification :class:`Rule`, the transport
table of the ``aiohttp``-based adapters, ``Retry-After`` parsing and SMS text facts (GSM-7
alphabet, segment count).

The adapters import these from here; ``notiflow.adapters.providers.twilio`` re-exports
``Rule``, ``classify_exception``, ``parse_retry_after`` and ``TRANSPORT_ERRORS`` for callers
that import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Final

import aiohttp

from notiflow.adapters.providers.base import Outcome


@dataclass(frozen=True, slots=True)
class Rule:
    """How one provider answer is classified."""

    outcome: Outcome
    reason: str
    deactivate: bool = False


_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

TRANSPORT_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (aiohttp.ConnectionTimeoutError, Rule(_T, "connect_timeout")),
    (aiohttp.ClientConnectorError, Rule(_T, "connect_error")),
    (aiohttp.InvalidURL, Rule(_T, "misconfigured")),
    (TimeoutError, Rule(_A, "timeout")),
    (aiohttp.ServerDisconnectedError, Rule(_A, "connection_lost")),
    (aiohttp.ClientPayloadError, Rule(_A, "connection_lost")),
    (aiohttp.ClientOSError, Rule(_A, "connection_lost")),
    (aiohttp.ClientError, Rule(_A, "transport_error")),
    (Exception, Rule(_A, "client_error")),
)
"""Exception type → rule for the ``aiohttp`` adapters, first ``isinstance`` match wins.
Connection set-up failures happen before a byte of the request is sent (TRANSIENT); anything
later may have been processed."""

def classify_exception(exc: BaseException) -> Rule:
    """The rule for a transport failure (see :data:`TRANSPORT_ERRORS`)."""
    for kind, rule in TRANSPORT_ERRORS:
        if isinstance(exc, kind):
            return rule
    return Rule(_A, "client_error")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if
    absent or unparseable. Never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def seconds(value: float | timedelta) -> float:
    """``value`` in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


GSM7_BASIC: Final = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "ÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà")
"""The GSM 03.38 default alphabet (one septet each)."""
GSM7_EXTENDED: Final = frozenset("^{}\\[~]|€\f")
"""Characters of the GSM 03.38 extension table (two septets each: escape + character)."""


def is_gsm7(text: str) -> bool:
    """True when ``text`` can be sent in the GSM-7 encoding."""
    return all(c in GSM7_BASIC or c in GSM7_EXTENDED for c in text)


def sms_segments(body: str, *, ucs2: bool = False) -> int:
    """SMS segments a carrier bills for ``body`` (GSM-7: 160/153 septets, else UCS-2:
    70/67 UTF-16 code units); ``ucs2`` forces UCS-2 (a ``unicode`` message)."""
    if not ucs2 and is_gsm7(body):
        units = len(body) + sum(c in GSM7_EXTENDED for c in body)
        single, multi = 160, 153
    else:
        units = len(body.encode("utf-16-le")) // 2
        single, multi = 70, 67
    return 1 if units <= single else -(-units // multi)
