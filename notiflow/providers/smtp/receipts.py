"""SMTP bounces (RFC 3464 delivery status notifications) → report → receipts (pure).

A DSN is correlated only by the tagged bounce address it was sent to
(:mod:`~notiflow.providers.smtp.bounces`): the envelope recipient the relay's pipe
names, or the DSN's own ``To`` / ``Delivered-To`` / ``X-Original-To``. A valid tag proves the
address is one the adapter used as an attempt's envelope sender, whoever wrote the header; the
headers and ids the DSN reports about the original message (``X-Notiflow-*``,
``Message-ID``, ``ENVID``, queue ids) are the bouncer's to write and are never read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import Message
from email.parser import BytesParser
from email.utils import parsedate_to_datetime
from typing import Final

from notiflow.correlation import CorrelationKeys
from notiflow.providers.smtp.bounces import first_attempt
from notiflow.providers.smtp.message import message_id_header
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt

DSN_ACTIONS: Final[Mapping[str, Status | None]] = {
    "failed": Status.BOUNCED,
    "delayed": None,
    "delivered": Status.DELIVERED,
    "relayed": Status.SENT,
    "expanded": Status.SENT,
}
"""RFC 3464 ``Action`` → notiflow status; ``failed`` is refined by :func:`dsn_status`."""

SOFT_FAILURE_CODES: Final = frozenset({"5.2.2", "5.4.7"})
SOFT_FAILURE_SUBJECTS: Final = frozenset({"5.3", "5.7"})
"""Permanent failures that say nothing bad about the address (mailbox full, delivery time
expired, the receiving system's trouble, policy blocks): FAILED rather than BOUNCED."""

_ENHANCED = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})\b")
ADDRESSED_TO: Final = ("To", "Delivered-To", "X-Original-To")
"""The DSN's own headers a bounce address may be read from."""
_DSN_PARSER = BytesParser(policy=policy.default)


@dataclass(frozen=True, slots=True)
class RecipientReport:
    """One per-recipient block of a DSN."""

    action: str
    status: str | None
    """The enhanced status code (``5.1.1``), without comments."""
    last_attempt: datetime | None


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What a DSN says: its per-recipient blocks, when it was written, and the addresses it
    was sent to (:data:`ADDRESSED_TO` values, where a bounce address may be found)."""

    recipients: tuple[RecipientReport, ...]
    reported_at: datetime | None
    addressed_to: tuple[str, ...] = ()


def _date(value: object) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(str(value))
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _field(block: Message, name: str) -> str | None:
    value = block.get(name)
    return str(value).strip() if value is not None and str(value).strip() else None


def _delivery_status(message: Message) -> Message | None:
    return next((p for p in message.walk() if p.get_content_type() == "message/delivery-status"),
                None)


def parse_dsn(raw: bytes, content_type: str | None = None) -> DeliveryReport:
    """Read an RFC 3464 delivery status notification posted whole (``message/rfc822``) or as
    its own ``multipart/report`` body (the MIME type then comes from ``content_type``).
    ``ValueError`` when there is no ``message/delivery-status`` part with recipients."""
    message = _DSN_PARSER.parsebytes(raw)
    report = _delivery_status(message)
    if report is None and content_type and content_type.lower().startswith("multipart/"):
        message = _DSN_PARSER.parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode(
            "latin-1", "replace") + raw)
        report = _delivery_status(message)
    if report is None:
        raise ValueError("no message/delivery-status part")
    payload = report.get_payload()
    blocks = [b for b in payload if isinstance(b, Message)] if isinstance(payload, list) else []
    if len(blocks) < 2:
        raise ValueError("the delivery-status part has no per-recipient fields")
    recipients = []
    for block in blocks[1:]:
        action = (_field(block, "Action") or "").lower()
        code = _ENHANCED.match(_field(block, "Status") or "")
        recipients.append(RecipientReport(
            action=action, status=".".join(code.groups()) if code else None,
            last_attempt=_date(block.get("Last-Attempt-Date"))))
    addressed = tuple(str(v) for name in ADDRESSED_TO for v in message.get_all(name) or ())
    return DeliveryReport(tuple(recipients), _date(message.get("Date")), addressed)


def attempt_of(report: DeliveryReport, keys: CorrelationKeys,
               envelope_to: str | None = None) -> tuple[str, int] | None:
    """``(message_id, attempt)`` of the first valid bounce address among ``envelope_to``
    (the envelope recipient the relay's pipe names) and the DSN's :data:`ADDRESSED_TO`
    headers; None when there is none."""
    return first_attempt(keys, [envelope_to, *report.addressed_to])


def dsn_status(action: str, code: str | None) -> Status | None:
    """The status of one recipient's report: ``failed`` with a 5.x.x code is BOUNCED unless
    the code is a soft failure (:data:`SOFT_FAILURE_CODES`, :data:`SOFT_FAILURE_SUBJECTS`),
    any other ``failed`` is FAILED; other actions map by :data:`DSN_ACTIONS`."""
    if action != "failed":
        return DSN_ACTIONS.get(action)
    hard = (code is not None and code.startswith("5.") and code not in SOFT_FAILURE_CODES
            and code.rsplit(".", 1)[0] not in SOFT_FAILURE_SUBJECTS)
    return Status.BOUNCED if hard else Status.FAILED


def dsn_receipts(report: DeliveryReport, provider_id: str, now: datetime,
                 attempt: tuple[str, int] | None = None) -> list[Receipt]:
    """The receipts of a DSN about ``attempt`` (:func:`attempt_of`; none without one, or for
    ``delayed`` or unknown actions). Their provider message id is the attempt's
    ``Message-ID`` (the reconciler checks the attempt was sent through this provider); each
    recipient's event id is derived from the report's content, so the same DSN posted twice
    dedups."""
    if attempt is None:
        return []
    message_id, attempt_no = attempt
    sent_as = message_id_header(message_id, attempt_no)[1:-1]
    receipts = []
    for i, r in enumerate(report.recipients):
        status = dsn_status(r.action, r.status)
        if status is None:
            continue
        receipts.append(Receipt(
            provider_id=provider_id,
            provider_event_id=f"dsn:{sent_as}:{i}:{r.action}:{r.status or '-'}",
            provider_message_id=sent_as,
            status=status,
            occurred_at=r.last_attempt or report.reported_at or now,
            raw_status=r.action,
            error_code=r.status if r.action == "failed" else None,
            message_id=message_id,
            attempt=attempt_no,
        ))
    return receipts
