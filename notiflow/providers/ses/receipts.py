"""SES events (the ``Message`` of an SNS notification) → :class:`Receipt` (pure).

Both SES shapes are read: event publishing through a configuration set (``eventType``, with
``mail.tags``, where the adapter's ``EmailTags`` ``message_id`` / ``attempt`` /
``traceparent`` come back) and identity notifications (``notificationType``, no tags: the
receipt is correlated by ``mail.messageId`` alone, the ``MessageId`` of ``SendEmail``).
``provider_event_id`` is the SNS ``MessageId``, which SNS keeps across its retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from notiflow.adapters.providers.webhook import clip, correlation
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

EVENTS: Final[Mapping[str, Status | None]] = {
    "Send": None,
    "DeliveryDelay": None,
    "Subscription": None,
    "Delivery": Status.DELIVERED,
    "Bounce": Status.BOUNCED,
    "Complaint": Status.DELIVERED,
    "Reject": Status.FAILED,
    "Rendering Failure": Status.FAILED,
    "Open": Status.OPENED,
    "Click": Status.CLICKED,
}
"""SES event type → notiflow status; None = no news (``Send`` is the acceptance the API
answer proved; a delay is not an outcome). A complaint proves delivery; its ``raw_status``
``complaint`` makes the reconciler suppress the address. Types not listed are ignored."""

BOUNCE_TYPES: Final[Mapping[str, tuple[Status, str]]] = {
    "Permanent": (Status.BOUNCED, "bounce"),
    "Transient": (Status.FAILED, "transient"),
    "Undetermined": (Status.FAILED, "undetermined"),
}
"""``bounce.bounceType`` → status and ``raw_status``: only a permanent bounce is a hard
bounce (the address is bad and gets suppressed); SES sends a transient one once it has
given up on this message, so the message failed but the address stays."""

_DETAIL: Final = {"Delivery": "delivery", "Bounce": "bounce", "Complaint": "complaint",
                  "Reject": "reject", "Rendering Failure": "failure", "Open": "open",
                  "Click": "click"}


@dataclass(frozen=True, slots=True)
class SesEvent:
    """One decoded SES event: its type and the ``(message_id, attempt, traceparent)`` of its
    tags (None for an identity notification)."""

    kind: str
    doc: dict[str, Any]
    traceparent: str | None


def decode(message: str) -> SesEvent:
    """The SES event in an SNS ``Message``; ``ValueError`` when it is not one."""
    try:
        doc = orjson.loads(message)
    except orjson.JSONDecodeError:
        raise ValueError("the SNS Message is not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("the SNS Message is not a JSON object")
    kind = doc.get("eventType", doc.get("notificationType"))
    if not isinstance(kind, str) or not kind:
        raise ValueError("neither eventType nor notificationType")
    return SesEvent(kind, doc, _tag(doc, "traceparent"))


def _tag(doc: Mapping[str, Any], name: str) -> str | None:
    mail = doc.get("mail")
    tags = mail.get("tags") if isinstance(mail, dict) else None
    values = tags.get(name) if isinstance(tags, dict) else None
    if isinstance(values, list) and values and isinstance(values[0], str):
        return values[0]
    return None


def _when(value: object, default: datetime) -> datetime:
    if not isinstance(value, str):
        return default
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return default
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _first(items: object) -> dict[str, Any]:
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return items[0]
    return {}


def event_receipt(event: SesEvent, provider_id: str, sns_message_id: str,
                  now: datetime) -> Receipt | None:
    """The receipt of one SES event; None for one without news (:data:`EVENTS`).
    ``ValueError`` (or a pydantic ``ValidationError``) when it is malformed."""
    status = EVENTS.get(event.kind)
    if status is None:
        return None
    doc = event.doc
    mail = doc.get("mail")
    ses_id = mail.get("messageId") if isinstance(mail, dict) else None
    if not isinstance(ses_id, str) or not ses_id:
        raise ValueError("mail.messageId missing")
    detail = doc.get(_DETAIL[event.kind])
    detail = detail if isinstance(detail, dict) else {}
    raw_status, error_code = event.kind.lower(), None
    if event.kind == "Bounce":
        bounce_type = detail.get("bounceType")
        if not isinstance(bounce_type, str) or bounce_type not in BOUNCE_TYPES:
            raise ValueError(f"unknown bounceType {bounce_type!r}")
        status, raw_status = BOUNCE_TYPES[bounce_type]
        recipient = _first(detail.get("bouncedRecipients"))
        error_code = clip(recipient.get("status") or detail.get("bounceSubType"))
    elif event.kind == "Complaint":
        error_code = clip(detail.get("complaintFeedbackType"))
    elif event.kind == "Reject":
        error_code = clip(detail.get("reason"))
    elif event.kind == "Rendering Failure":
        raw_status, error_code = "rendering_failure", clip(detail.get("errorMessage"))
    message_id, attempt = correlation(_tag(doc, "message_id"), _tag(doc, "attempt"))
    fallback = _when(mail.get("timestamp") if isinstance(mail, dict) else None, now)
    return Receipt(
        provider_id=provider_id,
        provider_event_id=sns_message_id,
        provider_message_id=ses_id,
        status=status,
        occurred_at=_when(detail.get("timestamp"), fallback),
        raw_status=raw_status,
        error_code=error_code,
        message_id=message_id,
        attempt=attempt,
    )
