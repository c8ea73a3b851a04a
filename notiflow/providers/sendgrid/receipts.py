"""SendGrid Event Webhook events → :class:`~notiflow.schemas.messages.Receipt` (pure).

SendGrid echoes the ``custom_args`` the adapter sent (``message_id``, ``attempt``,
``traceparent``) as top-level keys of every event: the correlation hint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from notiflow.adapters.providers.webhook import clip, correlation
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

EVENTS: Final[Mapping[str, Status | None]] = {
    "processed": None,
    "deferred": None,
    "delivered": Status.DELIVERED,
    "bounce": Status.BOUNCED,
    "dropped": Status.FAILED,
    "open": Status.OPENED,
    "click": Status.CLICKED,
    "spamreport": Status.DELIVERED,
    "unsubscribe": Status.DELIVERED,
    "group_unsubscribe": Status.DELIVERED,
    "group_resubscribe": Status.DELIVERED,
}
"""SendGrid ``event`` → notiflow status; None = no news (``processed`` is the acceptance the
send response already proved, ``deferred`` a transient delay). Spam reports and
(un)subscriptions prove delivery; their ``raw_status`` tells the reconciler to act on the
address. Event types not listed are ignored."""

BOUNCE_TYPES: Final[Mapping[str, Status]] = {
    "bounce": Status.BOUNCED,
    "blocked": Status.FAILED,
}
"""``type`` of a ``bounce`` event: a hard bounce (the address is bad) or a block (the receiving
server refused this message; the address stays valid)."""

_SG_SUFFIX = re.compile(r"\.(?:filter|recv)")


def sendgrid_message_id(sg_message_id: str) -> str:
    """The ``X-Message-Id`` of the send response that an event's ``sg_message_id`` extends
    (``<X-Message-Id>.filterdrecv-…`` → ``<X-Message-Id>``)."""
    suffix = _SG_SUFFIX.search(sg_message_id)
    return sg_message_id[:suffix.start()] if suffix else sg_message_id.split(".", 1)[0]


def _epoch(value: object, default: datetime) -> datetime:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return default
    return default


def event_receipt(event: object, provider_id: str, now: datetime) -> Receipt | None:
    """The receipt of one Event Webhook event; None for an event without news (see
    :data:`EVENTS`, unknown types included). ``ValueError`` (or a pydantic
    ``ValidationError``) when the event is malformed."""
    if not isinstance(event, dict):
        raise ValueError("event is not a JSON object")
    kind = event.get("event")
    if not isinstance(kind, str) or not kind:
        raise ValueError("event type missing")
    status = EVENTS.get(kind)
    if status is None:
        return None
    raw_status, error_code = kind, None
    if kind == "bounce":
        bounce_type = event.get("type", "bounce")
        if not isinstance(bounce_type, str) or bounce_type not in BOUNCE_TYPES:
            raise ValueError("unknown bounce type")
        status, raw_status = BOUNCE_TYPES[bounce_type], bounce_type
        error_code = clip(event.get("status"))
    elif kind == "dropped":
        error_code = clip(event.get("reason"))
    event_id, sg_message_id = event.get("sg_event_id"), event.get("sg_message_id")
    if not isinstance(event_id, str) or not event_id:
        raise ValueError("sg_event_id missing")
    if not isinstance(sg_message_id, str) or not sg_message_id:
        raise ValueError("sg_message_id missing")
    message_id, attempt = correlation(event.get("message_id"), event.get("attempt"))
    return Receipt(
        provider_id=provider_id,
        provider_event_id=event_id,
        provider_message_id=sendgrid_message_id(sg_message_id),
        status=status,
        occurred_at=_epoch(event.get("timestamp"), now),
        raw_status=raw_status,
        error_code=error_code,
        message_id=message_id,
        attempt=attempt,
    )
