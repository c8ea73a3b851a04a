"""Pure parts of the DLQ tooling: topic choice, filters, redaction, the replay plan."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from cryptography.fernet import Fernet

from notiflow.adapters.dlq import (
    REOPEN_REASON,
    DlqEntry,
    DlqFilter,
    MessageState,
    alert_line,
    channel_of,
    dlq_topics,
    ingest_channels,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import header
from notiflow.ops.dlq_actions import (
    REPLAY_HEADER,
    STATUS_GRACE,
    Refusal,
    ReplayPlan,
    plan_replay,
    redact,
    status_check,
)
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord, derived_message_id
from notiflow.settings import Settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CIPHER = DlqCipher(Fernet.generate_key())


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("NOTIFLOW_TENANTS", json.dumps([{"id": "acme", "token": "t-acme" * 6}]))
    monkeypatch.setenv("NOTIFLOW_INGEST_BINDING__REQUIRED", "false")  # test_ingest_binding.py
    return Settings(topic_prefix="x.")


def ingest(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "channel": "SMS", "tier": "P1", "tenant_id": "acme", "template_id": "otp",
        "template_version": 1, "recipient": "+14155552671", "variables": {"code": "1"},
        "message_id": "msg_1", "accepted_at": (NOW - timedelta(minutes=1)).isoformat(),
        "expires_at": (NOW + timedelta(minutes=10)).isoformat(), "attempt": 1}
    doc.update(extra)
    return doc


def entry(settings: Settings, payload: dict[str, Any] | bytes, *,
          source_topic: str | None = None, attempts: tuple[int, ...] = (),
          **extra: Any) -> tuple[DlqEntry, bytes]:
    raw = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    rec = DlqRecord.model_validate({
        "dlq_id": uuid.uuid4().hex, "tier": "P1", "reason": "retries exhausted",
        "error_class": "exhausted_unexplained", "category": "bug", "failed_at": NOW,
        "source_topic": source_topic or settings.ingest_topic(Channel.SMS, Tier.P1),
        "source_partition": 3, "source_offset": 17, "source_timestamp_ms": 1_772_366_000_000,
        "payload_encrypted": CIPHER.encrypt(raw),
        "attempts": [AttemptRecord(attempt_no=n, provider_id="twilio", outcome="transient",
                                   started_at=NOW, completed_at=NOW) for n in attempts],
        **extra})
    return DlqEntry(rec, settings.dlq_topic(Tier.P1), 0, 5, None), raw


def test_dlq_topics_and_selectors(settings: Settings) -> None:
    topics = dlq_topics(settings)
    assert list(topics) == ["P0", "P1", "P2", "P3", "reconcile", "webhooks"]
    assert topics["P1"] == "x.notify.dlq.p1" and topics["webhooks"] == "x.notify.dlq.webhooks"
    assert dlq_topics(settings, "p2") == {"P2": "x.notify.dlq.p2"}
    assert dlq_topics(settings, "Reconcile") == {"reconcile": "x.notify.dlq.reconcile"}
    with pytest.raises(ValueError, match="unknown DLQ"):
        dlq_topics(settings, "p9")


def test_filter_matches_every_criterion(settings: Settings) -> None:
    e, _ = entry(settings, ingest(), message_id="msg_1", tenant_id="acme")
    r = e.record
    assert DlqFilter().matches(r) and not DlqFilter().narrows
    assert DlqFilter(reason="EXHAUSTED").matches(r)
    assert not DlqFilter(reason="poison").matches(r)
    assert DlqFilter(category="bug", error_class="exhausted_unexplained").matches(r)
    assert not DlqFilter(category="invalid_data").matches(r)
    assert DlqFilter(tenant="acme", message_id="msg_1").matches(r)
    assert not DlqFilter(tenant="globex").matches(r)
    assert DlqFilter(since=NOW, until=NOW + timedelta(seconds=1)).matches(r)
    assert not DlqFilter(until=NOW).matches(r)
    assert not DlqFilter(ids=frozenset({"other"})).matches(r)


def test_channel_from_topic_header_or_payload(settings: Settings) -> None:
    channels = ingest_channels(settings)
    e, _ = entry(settings, ingest())
    assert channel_of(e, channels, None) is Channel.SMS
    e, _ = entry(settings, ingest(channel="EMAIL", recipient="a@example.com"),
                 source_topic="x.ingest.shared")
    assert channel_of(e, channels, None) is None
    assert channel_of(e, channels, CIPHER) is Channel.EMAIL
    e, _ = entry(settings, b"junk", source_topic="x.ingest.shared", headers={"channel": "push"})
    assert channel_of(e, channels, None) is Channel.PUSH


def test_redact_masks_recipients_anywhere() -> None:
    doc = {"recipient": {"device_token": "a" * 64, "platform": "ios"},
           "to": "+14155552671", "note": "mail jane@example.com or +447911123456",
           "variables": {"code": "123456"}, "n": 3}
    out = redact(doc)
    text = json.dumps(out)
    assert "a" * 64 not in text and "jane@example.com" not in text
    assert "+14155552671" not in text and "+447911123456" not in text
    assert out["to"] == "+1415*****71" and "j***@example.com" in out["note"]
    assert out["variables"] == {"code": "123456"} and out["n"] == 3
    assert redact({"recipient": "jane@example.com"}) == {"recipient": "j***@example.com"}


def test_replay_plan_starts_a_fresh_budget(settings: Settings) -> None:
    e, raw = entry(settings, ingest(attempt=3, not_before=NOW.isoformat(),
                                    avoid_provider="twilio", unknown_check=2,
                                    provider_waits={"twilio": NOW.isoformat()}),
                   attempts=(3,))
    plan = plan_replay(e, raw, settings, now=NOW, seen_attempts=[4])
    assert isinstance(plan, ReplayPlan)
    r = plan.record
    assert (r.attempt, r.budget_base, plan.previous_attempt, plan.dead_attempt) == (5, 5, 4, 3)
    assert r.not_before is None and r.avoid_provider is None and r.unknown_check is None
    assert r.provider_waits is None
    assert r.message_id == "msg_1" and r.recipient == "+14155552671"
    assert plan.topic == "x.ingest.sms.p1" and plan.key == b"msg_1"
    assert header(plan.headers, REPLAY_HEADER) == e.dlq_id
    assert header(plan.headers, "message_id") == "msg_1"
    assert plan.extended_to is None and plan.detail()["attempt"] == 5


def test_replay_plan_keeps_the_message_id_a_direct_producer_left_out(
        settings: Settings) -> None:
    doc = ingest(ordering_key="order-9")
    for k in ("message_id", "accepted_at", "expires_at"):
        doc.pop(k)
    e, raw = entry(settings, doc)
    plan = plan_replay(e, raw, settings, now=NOW)
    assert isinstance(plan, ReplayPlan)
    assert plan.record.message_id == derived_message_id("kafka", "x.ingest.sms.p1", "3", "17")
    assert plan.key == b"acme:order-9" and plan.record.attempt == 2


def test_replay_refusals(settings: Settings) -> None:
    expired = ingest(expires_at=(NOW - timedelta(seconds=1)).isoformat())
    e, raw = entry(settings, expired)
    refusal = plan_replay(e, raw, settings, now=NOW)
    assert isinstance(refusal, Refusal) and "expired" in refusal.why
    plan = plan_replay(e, raw, settings, now=NOW, extend_ttl=timedelta(minutes=5))
    assert isinstance(plan, ReplayPlan)
    assert plan.record.expires_at == NOW + timedelta(minutes=5) and plan.extended_to

    e, raw = entry(settings, {"provider_id": "twilio"}, source_topic="x.notify.receipts")
    assert "not a send request" in plan_replay(e, raw, settings, now=NOW).why  # type: ignore[union-attr]
    e, raw = entry(settings, b'{"channel": ')
    assert "not a valid ingest record" in plan_replay(e, raw, settings, now=NOW).why  # type: ignore[union-attr]
    e, raw = entry(settings, ingest(tenant_id="ghost"))
    assert "not configured" in plan_replay(e, raw, settings, now=NOW).why  # type: ignore[union-attr]
    e, raw = entry(settings, ingest(attempt=1000))
    assert "limit" in plan_replay(e, raw, settings, now=NOW).why  # type: ignore[union-attr]


def state(status: Status | None, attempt: int = 0, reason: str | None = None) -> MessageState:
    return MessageState(status, 0, attempt, reason, None, attempt)


def test_status_check_reopens_failed_and_refuses_what_would_duplicate(
        settings: Settings) -> None:
    e, _ = entry(settings, ingest(attempt=5), attempts=(5,))
    dl = e.record
    assert status_check(state(Status.FAILED, 5), dl, 5, NOW) is True
    assert status_check(state(Status.EXPIRED, 5), dl, 5, NOW) is True
    for st in (Status.PROVIDER_ACCEPTED, Status.SENT, Status.DELIVERED):
        out = status_check(state(st, 6), dl, 5, NOW)
        assert isinstance(out, Refusal) and "send it twice" in out.why
    out = status_check(state(Status.SUPPRESSED, 1, "unsubscribed"), dl, 5, NOW)
    assert isinstance(out, Refusal) and "SUPPRESSED" in out.why
    out = status_check(state(Status.CANCELLED, 5, "cancelled"), dl, 5, NOW)
    assert isinstance(out, Refusal) and "CANCELLED" in out.why
    out = status_check(state(Status.QUEUED, 5, REOPEN_REASON), dl, 5, NOW)
    assert isinstance(out, Refusal) and "earlier replay" in out.why
    out = status_check(state(Status.RETRY_PENDING, 7), dl, 5, NOW)
    assert isinstance(out, Refusal) and "in flight" in out.why


def test_status_check_waits_for_the_final_status_of_a_recent_dead_letter(
        settings: Settings) -> None:
    e, _ = entry(settings, ingest(attempt=5), attempts=(5,))
    dl = e.record
    for st in (None, Status.QUEUED, Status.RETRY_PENDING):
        out = status_check(state(st, 4), dl, 5, NOW)
        assert isinstance(out, Refusal) and "not recorded yet" in out.why
        assert status_check(state(st, 4), dl, 5, NOW + STATUS_GRACE) is False
    no_attempts, _ = entry(settings, ingest())
    assert status_check(state(None), no_attempts.record, 1, NOW) is False
    assert status_check(state(Status.QUEUED), no_attempts.record, 1, NOW) is False


def test_alert_line_is_stable() -> None:
    assert alert_line("P1", "notify.dlq.p1", 10_001, 10_000) == (
        "DLQ_DEPTH_ALERT dlq=P1 topic=notify.dlq.p1 depth=10001 threshold=10000")


def test_key_rotation_decrypts_with_every_listed_key() -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    sealed = DlqCipher(old).encrypt(b"payload")
    rotated = DlqCipher(f"{new},{old}")
    assert rotated.decrypt(sealed) == b"payload"
    assert DlqCipher(new).decrypt(rotated.encrypt(b"fresh")) == b"fresh"
    with pytest.raises(ValueError, match="cannot be decrypted"):
        DlqCipher(new).decrypt(sealed)
