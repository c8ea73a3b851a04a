"""The DLQ limit: isolated poison passes, one source's invalid records quarantine that source
without halting, a systemic flood of dead letters halts the flow."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.common.guard import DlqGuard, DlqLimitBreached, source_of
from notiflow.flows.common.items import Retry
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord, StatusEvent
from notiflow.settings import DlqRule

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def dead() -> DlqRecord:
    """A systemic dead letter (a stage failed on a well-formed record)."""
    return DlqRecord(dlq_id=uuid.uuid4().hex, reason="render failed", error_class="bug",
                     category="bug", failed_at=NOW, source_topic="t",
                     source_partition=0, source_offset=1, payload_encrypted="x")


def invalid(tenant: str | None = None, headers: dict[str, str] | None = None) -> DlqRecord:
    return DlqRecord(dlq_id=uuid.uuid4().hex, reason="invalid record: recipient", tenant_id=tenant,
                     error_class="validation", category="invalid_data", failed_at=NOW,
                     source_topic="t", source_partition=0, source_offset=1,
                     payload_encrypted="x", headers=headers or {})


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


def test_sources_of_dead_letters() -> None:
    assert source_of(invalid("acme")) == "tenant:acme"
    assert source_of(invalid(headers={"tenant_id": "globex"})) == "tenant:globex"
    assert source_of(invalid(headers={"producer": "billing"})) == "producer:billing"
    assert source_of(invalid()) == "unattributed"


def test_one_sources_flood_quarantines_it_and_never_halts(
        caplog: pytest.LogCaptureFixture) -> None:
    rule = DlqRule(max_consecutive=5, max_ratio=0.5, ratio_window=20, quarantine_after=4)
    g = DlqGuard(rule, "send.p1")
    for _ in range(200):
        g(invalid("globex"))
    assert g.quarantined == {"tenant:globex"}
    assert caplog.text.count("PRODUCER_QUARANTINE flow=send.p1 source=tenant:globex") == 1
    for _ in range(20):
        g(ok())
    assert g.quarantined == frozenset()
    for _ in range(4):
        g(invalid("globex"))
    assert caplog.text.count("PRODUCER_QUARANTINE") == 2
    assert "DLQ_LIMIT_BREACH" not in caplog.text


def test_invalid_records_from_many_sources_halt_like_a_schema_change() -> None:
    rule = DlqRule(max_consecutive=6, ratio_window=50, quarantine_after=40, systemic_sources=3)
    g = DlqGuard(rule, "send.p1")
    g(invalid("a"))
    g(invalid("b"))
    with pytest.raises(DlqLimitBreached, match="6 dead letters in a row"):
        for t in "cabcab":
            g(invalid(t))


Item = tuple[str, str | None]
ITEMS = st.lists(st.sampled_from([("ok", None), ("bug", None), ("invalid", "a"),
                                  ("invalid", "b"), ("invalid", "c")]), max_size=300)


@given(ITEMS)
def test_quarantine_and_halt_against_a_model(seq: list[Item]) -> None:
    """Against a naive model that recounts the window at every output: a quarantined
    source's records never count, the others count while enough of them are in the
    window."""
    rule = DlqRule(max_consecutive=6, max_ratio=0.5, ratio_window=20, quarantine_after=5,
                   systemic_sources=2)
    g = DlqGuard(rule, "x")
    alerted: set[str] = set()
    run = 0
    for i, (kind, tenant) in enumerate(seq):
        window = seq[max(0, i + 1 - rule.ratio_window):i + 1]
        sources = Counter(t for k, t in window if k == "invalid")
        alerted &= set(sources)
        if tenant and sources[tenant] >= rule.quarantine_after:
            alerted.add(tenant)
        free = [t for t in sources if t not in alerted]
        spread = len(free) >= rule.systemic_sources
        if kind == "ok":
            run = 0
        elif kind == "bug" or (tenant not in alerted and spread):
            run += 1
        dead = sum(1 for k, _ in window if k == "bug") + (
            sum(sources[t] for t in free) if spread else 0)
        breach = run >= rule.max_consecutive or (
            len(window) == rule.ratio_window and dead / len(window) > rule.max_ratio)
        item = ok() if kind == "ok" else dead_letter_of(kind, tenant)
        if breach:
            with pytest.raises(DlqLimitBreached):
                g(item)
            return
        g(item)
        assert g.quarantined == {f"tenant:{t}" for t in alerted}


def dead_letter_of(kind: str, tenant: str | None) -> DlqRecord:
    return dead() if kind == "bug" else invalid(tenant)
