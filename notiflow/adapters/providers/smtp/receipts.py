"""SMTP bounces (RFC 3464 delivery status notifications) → report → receipts (pure).

A DSN names the message it reports on by the headers the adapter wrote (``X-Notiflow-*``,
``Message-ID``; ``message``), by ``Original-Envelope-Id`` (the ``ENVID`` xtext), or by the
relay's queue id (``X-Postfix-Queue-ID``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import Message
from email.parser import BytesParser, HeaderParser
from email.utils import parsedate_to_datetime
from typing import Final

from notiflow.adapters.providers.smtp.message import (
    ATTEMPT_HEADER,
    MESSAGE_ID_DOMAIN,
    MESSAGE_ID_HEADER,
    message_id_header,
)
from notiflow.adapters.providers.webhook import correlation
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
_OUR_MESSAGE_ID = re.compile(
    rf"<?([A-Za-z0-9_-]{{1,64}})\.(\d{{1,5}})@{re.escape(MESSAGE_ID_DOMAIN)}>?")
_XTEXT = re.compile(r"\+([0-9A-F]{2})")
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
    """What a DSN says about one message we sent."""

    message_id: str | None
    attempt: int | None
    provider_message_id: str | None
    recipients: tuple[RecipientReport, ...]
    reported_at: datetime | None


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


def _returned_headers(message: Message) -> Message | None:
    """The original message's headers a DSN returns (``text/rfc822-headers`` or
    ``message/rfc822``), if any."""
    for part in message.walk():
        kind = part.get_content_type()
        if kind in ("text/rfc822-headers", "message/rfc822-headers"):
            payload = part.get_payload(decode=True)
            text = (payload.decode("utf-8", "replace") if isinstance(payload, bytes)
                    else str(part.get_payload()))
            return HeaderParser(policy=policy.default).parsestr(text)
        if kind == "message/rfc822":
            inner = part.get_payload()
            if isinstance(inner, list) and inner and isinstance(inner[0], Message):
                return inner[0]
    return None


def _xtext_decode(value: str) -> str:
    return _XTEXT.sub(lambda m: chr(int(m.group(1), 16)), value)


def _hint(original: Message | None, envid: str | None) -> tuple[str | None, int | None]:
    if original is not None:
        found = correlation(_field(original, MESSAGE_ID_HEADER),
                            _field(original, ATTEMPT_HEADER))
        if found[0] is not None:
            return found
        ours = _OUR_MESSAGE_ID.fullmatch(_field(original, "Message-ID") or "")
        if ours:
            return correlation(ours.group(1), ours.group(2))
    if envid:
        message_id, _, attempt = _xtext_decode(envid).rpartition(".")
        return correlation(message_id, attempt)
    return None, None


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
    per_message = blocks[0]
    recipients = []
    for block in blocks[1:]:
        action = (_field(block, "Action") or "").lower()
        code = _ENHANCED.match(_field(block, "Status") or "")
        recipients.append(RecipientReport(
            action=action, status=".".join(code.groups()) if code else None,
            last_attempt=_date(block.get("Last-Attempt-Date"))))
    original = _returned_headers(message)
    message_id, attempt = _hint(original, _field(per_message, "Original-Envelope-Id"))
    provider_message_id = _field(per_message, "X-Postfix-Queue-ID")
    if provider_message_id is None and original is not None:
        provider_message_id = (_field(original, "Message-ID") or "").strip("<>") or None
    if provider_message_id is None and message_id is not None and attempt is not None:
        provider_message_id = message_id_header(message_id, attempt)[1:-1]
    return DeliveryReport(message_id, attempt, provider_message_id, tuple(recipients),
                          _date(message.get("Date")))


def dsn_status(action: str, code: str | None) -> Status | None:
    """The status of one recipient's report: ``failed`` with a 5.x.x code is BOUNCED unless
    the code is a soft failure (:data:`SOFT_FAILURE_CODES`, :data:`SOFT_FAILURE_SUBJECTS`),
    any other ``failed`` is FAILED; other actions map by :data:`DSN_ACTIONS`."""
    if action != "failed":
        return DSN_ACTIONS.get(action)
    hard = (code is not None and code.startswith("5.") and code not in SOFT_FAILURE_CODES
            and code.rsplit(".", 1)[0] not in SOFT_FAILURE_SUBJECTS)
    return Status.BOUNCED if hard else Status.FAILED


def dsn_receipts(report: DeliveryReport, provider_id: str, now: datetime) -> list[Receipt]:
    """The receipts of a DSN (none for ``delayed`` or unknown actions). Each recipient's
    event id is derived from the report's content, so the same DSN posted twice dedups."""
    if report.provider_message_id is None:
        return []
    receipts = []
    for i, r in enumerate(report.recipients):
        status = dsn_status(r.action, r.status)
        if status is None:
            continue
        receipts.append(Receipt(
            provider_id=provider_id,
            provider_event_id=f"dsn:{report.provider_message_id}:{i}:{r.action}:"
                              f"{r.status or '-'}",
            provider_message_id=report.provider_message_id,
            status=status,
            occurred_at=r.last_attempt or report.reported_at or now,
            raw_status=r.action,
            error_code=r.status if r.action == "failed" else None,
            message_id=report.message_id,
            attempt=report.attempt,
        ))
    return receipts
