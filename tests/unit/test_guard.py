"""The DLQ limit: isolated poison passes, a flood of dead letters halts the flow."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.guard import DlqGuard, DlqLimitBreached
from notiflow.flows.model import Retry
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord, StatusEvent
from notiflow.settings import DlqRule

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def dead() -> DlqRecord:
    return DlqRecord(dlq_id=uuid.uuid4().hex, reason="invalid", error_class="validation",
                     category="invalid_data", failed_at=NOW, source_topic="t",
                     source_partition=0, source_offset=1, payload_encrypted="x")


def ok() -> StatusEvent:
    return StatusEvent(event_id=uuid.uuid4().hex, message_id="msg_1", tenant_id="acme",
                       channel=Channel.SMS, tier=Tier.P1, status=Status.PROVIDER_ACCEPTED,
                       attempt=1, occurred_at=NOW,
                       source="test")


def test_consecutive_dead_letters_halt(caplog: pytest.LogCaptureFixture) -> None:
    g = DlqGuard(DlqRule(max_consecutive=3), "send.p1")
    for _ in range(2):
        g(dead())
    g(ok())
    g(dead())
    g(dead())
    with pytest.raises(DlqLimitBreached, match="3 dead letters in a row"):
        g(dead())
    assert "DLQ_LIMIT_BREACH flow=send.p1" in caplog.text


def test_ratio_over_a_full_window_halts() -> None:
    g = DlqGuard(DlqRule(max_consecutive=1000, max_ratio=0.5, ratio_window=10), "reconcile")
    for _ in range(4):
        g(dead())
        g(ok())
    g(ok())
    g(dead())
    g(ok())
    with pytest.raises(DlqLimitBreached, match="6 of the last 10"):
        for _ in range(2):
            g(dead())
            g(dead())


def test_items_that_are_neither_pass_uncounted() -> None:
    g = DlqGuard(DlqRule(max_consecutive=2), "send.p0")
    item = object()
    g(dead())
    assert g(item) is item
    assert g(Retry.__new__(Retry)) is not None
    with pytest.raises(DlqLimitBreached):
        g(dead())


@given(st.lists(st.booleans(), max_size=300))
def test_breach_iff_a_rule_is_broken(seq: list[bool]) -> None:
    """Against a naive model: halts exactly at the first output that breaks either rule."""
    rule = DlqRule(max_consecutive=5, max_ratio=0.4, ratio_window=20)
    g = DlqGuard(rule, "x")
    for i, is_dead in enumerate(seq):
        seen = seq[:i + 1]
        run = len(seen) - len("".join("d" if d else "o" for d in seen).rstrip("d"))
        window = seen[-rule.ratio_window:]
        expected = run >= rule.max_consecutive or (
            len(window) == rule.ratio_window and sum(window) / len(window) > rule.max_ratio)
        if expected:
            with pytest.raises(DlqLimitBreached):
                g(dead() if is_dead else ok())
            return
        g(dead() if is_dead else ok())
