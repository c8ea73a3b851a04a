"""Vonage delivery receipts (DLRs) → :class:`~notiflow.schemas.messages.Receipt` (pure), and
the ``client-ref`` correlation hint the adapter writes and every DLR of the message echoes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from notiflow.adapters.providers.webhook import clip, correlation
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

MAX_CLIENT_REF: Final = 100
"""Longest ``client-ref`` Vonage accepts."""

DLR_STATUSES: Final[Mapping[str, Status | None]] = {
    "accepted": Status.SENT,
    "buffered": Status.SENT,
    "delivered": Status.DELIVERED,
    "expired": Status.FAILED,
    "failed": Status.FAILED,
    "rejected": Status.FAILED,
    "unknown": None,
}
"""Delivery-receipt ``status`` → platform status (None: no information, ignore)."""


def client_ref(message_id: str, attempt: int) -> str:
    """The ``client-ref`` of one attempt."""
    return f"{message_id}:{attempt}"


def parse_client_ref(ref: str | None) -> tuple[str, int] | None:
    """(message_id, attempt) of a ``client-ref`` this adapter wrote; None otherwise."""
    if not ref:
        return None
    message_id, sep, attempt = ref.rpartition(":")
    if not sep or not message_id or not attempt.isdigit():
        return None
    return message_id, int(attempt)


def _dlr_time(value: str | None, default: datetime) -> datetime:
    if not value:
        return default
    try:
        return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return default


def dlr_receipt(params: Mapping[str, str], provider_id: str, now: datetime) -> Receipt | None:
    """The receipt of one DLR; None for ``status=unknown``; ``ValueError`` without a
    ``messageId`` or with an unknown ``status``."""
    sid = params.get("messageId")
    raw_status = params.get("status", "").lower()
    if not sid or raw_status not in DLR_STATUSES:
        raise ValueError("messageId or status missing or unknown")
    status = DLR_STATUSES[raw_status]
    if status is None:
        return None
    ref = parse_client_ref(params.get("client-ref"))
    message_id, attempt = correlation(*ref) if ref else (None, None)
    err = params.get("err-code")
    return Receipt(
        provider_id=provider_id,
        provider_event_id=f"{sid}:{raw_status}",
        provider_message_id=sid,
        status=status,
        occurred_at=_dlr_time(params.get("message-timestamp"), now),
        raw_status=raw_status,
        error_code=clip(err) if err and err != "0" else None,
        message_id=message_id,
        attempt=attempt,
    )
