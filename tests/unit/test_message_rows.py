"""The rows of ``adapters/rows.py`` as the Cassandra mappers build them from driver rows
(naive UTC timestamps, every selected column present, empty ones None)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notiflow.adapters.cassandra.attempts import attempt_row
from notiflow.adapters.cassandra.messages import (
    MessageStore,
    message_event,
    message_head,
    message_row,
)
from notiflow.adapters.cassandra.templates import template_row
from notiflow.adapters.rows import (
    AttemptRow,
    MessageEventRow,
    MessageHeadRow,
    MessageRow,
    TemplateRow,
)
from notiflow.schemas.enums import Category, Channel, Status, Tier
from notiflow.schemas.messages import MessageSnapshot
from notiflow.schemas.status import rank

AT = datetime(2026, 12, 7, 12, 0, 0, 123000, tzinfo=UTC)
NAIVE = AT.replace(tzinfo=None)
COLUMNS = ("message_id", "tenant_id", "channel", "tier", "category", "recipient_hash",
           "recipient_masked", "template_id", "template_version", "idempotency_key",
           "ordering_key", "status_webhook", "status", "status_rank", "reason", "attempt",
           "provider_id", "provider_message_id", "next_attempt_at", "scheduled_at",
           "expires_at", "accepted_at", "created_at", "updated_at")


def test_a_whole_message_row_maps_column_by_column() -> None:
    driver = dict.fromkeys(COLUMNS)
    driver.update(message_id="msg_1", tenant_id="acme", channel="SMS", tier="P1",
                  category="otp", recipient_hash="h" * 16, template_id="otp",
                  template_version=3, status="FAILED", status_rank=rank(Status.FAILED, 2),
                  reason="invalid_recipient", attempt=2, provider_id="twilio",
                  accepted_at=NAIVE, expires_at=NAIVE + timedelta(hours=1), updated_at=AT)
    row = message_row(driver)
    assert {f.name for f in dataclasses.fields(MessageRow)} == set(COLUMNS)
    assert {f.name: getattr(row, f.name) for f in dataclasses.fields(row)} == {
        **driver, "accepted_at": AT, "expires_at": AT + timedelta(hours=1)}
    assert row.current() is Status.FAILED


def test_a_row_left_with_no_status_says_so() -> None:
    row = message_row({"message_id": "msg_1", "tenant_id": "acme"})
    assert row == MessageRow("msg_1", tenant_id="acme")
    with pytest.raises(ValueError, match="msg_1"):
        row.current()


def test_heads_map_with_aware_times_and_ignore_the_coalesced_key() -> None:
    head = message_head({"message_id": "msg_1", "status_rank": 7, "status": "SENT",
                         "attempt": 1, "reason": None, "updated_at": NAIVE,
                         "provider_id": "twilio", "tier": "P1", "tenant_id": "acme",
                         "channel": "SMS", "category": "otp", "created_wt": 10,
                         "status_wt": 12})
    assert head == MessageHeadRow(7, "SENT", 1, None, AT, "twilio", "P1", "acme", "SMS",
                                  "otp", 10, 12)


def test_the_head_of_a_created_row_is_what_reading_it_returns() -> None:
    snap = MessageSnapshot(tenant_id="acme", channel=Channel.SMS, tier=Tier.P1,
                           category=Category.OTP, template_id="otp", template_version=1,
                           recipient_hash="h" * 16, recipient_masked="+1***", accepted_at=AT)
    wt = int(AT.timestamp() * 1_000_000)
    read = message_head({"status_rank": rank(Status.QUEUED), "status": "QUEUED",
                         "attempt": 0, "reason": None, "updated_at": NAIVE,
                         "provider_id": None, "tier": "P1", "tenant_id": "acme",
                         "channel": "SMS", "category": "otp", "created_wt": wt,
                         "status_wt": wt})
    assert MessageStore.created_head(snap, Status.QUEUED, AT) == read


def test_history_rows_map_with_defaults_for_empty_cells() -> None:
    event = message_event({"message_id": "msg_1", "occurred_at": NAIVE, "event_id": "e1",
                           "status": "QUEUED", "attempt": None, "reason": None,
                           "source": "api", "applied": None})
    assert event == MessageEventRow("msg_1", AT, "e1", "QUEUED", 0, None, "api", False)


class KeyedReads:
    """The keyed reads of a ``Statements``: each read is recorded when it is asked for."""

    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        self.rows = rows
        self.asked: list[str] = []

    def prepare(self, statements: Any, optional: bool = False) -> None:
        pass

    def keyed(self, *args: Any) -> None:
        pass

    def read_each(self, name: str, keys: Sequence[tuple[tuple[Any, ...], Any]]
                  ) -> Awaitable[list[dict[str, Any] | None]]:
        self.asked += [k for _, k in keys]

        async def rows() -> list[dict[str, Any] | None]:
            return [self.rows.get(k) for _, k in keys]

        return rows()


def test_heads_are_asked_for_when_called_and_mapped_when_awaited() -> None:
    reads = KeyedReads({"m1": {"message_id": "m1", "status": "SENT", "status_rank": 7}})
    store = MessageStore(reads, None)  # type: ignore[arg-type]
    pending = store.heads(["m1", "m2"])
    assert reads.asked == ["m1", "m2"]
    assert asyncio.run(_await(pending)) == [MessageHeadRow(status_rank=7, status="SENT"), None]


async def _await(pending: Awaitable[list[MessageHeadRow | None]]) -> list[MessageHeadRow | None]:
    return await pending


def test_template_and_attempt_rows_map_with_aware_times() -> None:
    template = template_row({"tenant_id": "acme", "template_id": "otp", "version": 2,
                             "channel": "SMS", "subject": None, "body": "Code {{ code }}",
                             "variables": ["code"], "checksum": None, "created_at": NAIVE,
                             "description": None})
    assert template == TemplateRow("acme", "otp", 2, "SMS", None, "Code {{ code }}",
                                   ("code",), "", AT)
    attempt = attempt_row({"message_id": "msg_1", "attempt_no": 1, "provider_id": "twilio",
                           "provider_message_id": "SM1", "outcome": "accepted",
                           "normalized_error": None, "error_code": None,
                           "started_at": NAIVE, "completed_at": None})
    assert attempt == AttemptRow("msg_1", 1, "twilio", "SM1", "accepted", None, None, AT, None)
