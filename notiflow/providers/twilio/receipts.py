"""Twilio status callbacks → :class:`~notiflow.schemas.messages.Receipt` (pure).

The correlation hint is the query the adapter put into the signed StatusCallback URL
(``message_id``, ``attempt``, ``traceparent``; ``client.status_callback``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

STATUSES: Final[Mapping[str, Status | None]] = {
    "accepted": None,
    "scheduled": None,
    "queued": None,
    "sending": None,
    "sent": Status.SENT,
    "delivered": Status.DELIVERED,
    "read": Status.OPENED,
    "undelivered": Status.FAILED,
    "failed": Status.FAILED,
    "canceled": Status.FAILED,
}
"""Twilio MessageStatus → notiflow status; None = a state before or at provider acceptance,
already known from the send response."""


def callback_receipt(params: Mapping[str, str], query: Mapping[str, str], provider_id: str,
                     now: datetime) -> Receipt | None:
    """The receipt of one status callback (``params`` its form body, ``query`` its URL query);
    None for a state without news (see :data:`STATUSES`). ``ValueError`` without a message sid
    or with an unknown status."""
    sid = params.get("MessageSid") or params.get("SmsSid")
    raw_status = (params.get("MessageStatus") or params.get("SmsStatus") or "").lower()
    if not sid or raw_status not in STATUSES:
        raise ValueError("MessageSid or MessageStatus missing or unknown")
    status = STATUSES[raw_status]
    if status is None:
        return None
    attempt = query.get("attempt", "")
    return Receipt(
        provider_id=provider_id,
        provider_event_id=f"{sid}:{raw_status}",
        provider_message_id=sid,
        status=status,
        occurred_at=now,
        raw_status=raw_status,
        error_code=params.get("ErrorCode") or None,
        message_id=query.get("message_id") or None,
        attempt=int(attempt) if attempt.isdigit() else None,
    )
