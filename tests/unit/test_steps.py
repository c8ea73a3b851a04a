"""Pure steps of the send flow: parsing into work or errors-as-data, holding, encoding."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet
from pydantic import ValidationError

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import dump, envelope, new_key
from notiflow.flows.common.items import Retry, SourceRef, Work
from notiflow.flows.common.steps import Encoder, Hold, IngestParser, complete_record, retry_record
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, StatusEvent
from notiflow.settings import IngestEncryption, Settings

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = Fernet.generate_key()
TENANTS = json.dumps([
    {"id": "acme", "token": "t-acme-0123456789abcdef0123456789", "senders": ["ACME"]},
    {"id": "mkt", "token": "t-mkt-0123456789abcdef0123456789ab", "tiers": ["P2", "P3"]},
])


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("NOTIFLOW_TENANTS", TENANTS)
    monkeypatch.setenv("NOTIFLOW_TWILIO__AUTH_TOKEN", "secret")
    monkeypatch.setenv("NOTIFLOW_TOPIC_PREFIX", "")
    monkeypatch.setenv("NOTIFLOW_INGEST_BINDING__REQUIRED", "false")  # test_ingest_binding.py
    return Settings(dlq_key=KEY.decode())


def kmsg(value: bytes | None, topic: str = "ingest.sms.p1", offset: int = 7,
         ts: int = 1_772_366_400_000) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=b"k", value=value, topic=topic, headers=[], latency=None,
                              offset=offset, partition=2, timestamp=(1, ts))


def body(**kw: object) -> bytes:
    doc: dict[str, object] = {"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
                              "template_id": "otp", "template_version": 1, "tenant_id": "acme",
                              "variables": {"code": "123456"}}
    doc.update(kw)
    return orjson.dumps(doc)


def parse(settings: Settings, msg: KafkaSourceMessage, tier: Tier = Tier.P1):
    return IngestParser(settings, tier, DlqCipher(KEY), lambda: NOW)(msg)


def test_direct_producer_record_becomes_work_with_stable_id(settings: Settings) -> None:
    w = parse(settings, kmsg(body()))
    assert isinstance(w, Work)
    assert w.message_id == parse(settings, kmsg(body())).message_id
    assert w.message_id != parse(settings, kmsg(body(), offset=8)).message_id
    assert w.accepted_at == datetime.fromtimestamp(1_772_366_400, UTC)
    assert w.record.expires_at == w.accepted_at + timedelta(minutes=30)
    keyed = parse(settings, kmsg(body(idempotency_key="order-1"), offset=9))
    assert keyed.message_id == parse(settings, kmsg(body(idempotency_key="order-1"))).message_id


@pytest.mark.parametrize(("value", "error_class", "fragment"), [
    (b"{not json", "poison", "not JSON"),
    (b"[1, 2]", "poison", "not an object"),
    (None, "poison", "tombstone"),
    (body(schema_version=9), "unknown_schema", "schema_version 9"),
    (body(recipient="12345"), "validation", "phone number"),
    (body(tenant_id="nobody"), "unknown_tenant", "unknown tenant"),
    (body(tier="P0"), "wrong_topic", "on topic"),
])
def test_bad_records_become_dlq_records(settings: Settings, value: bytes | None,
                                        error_class: str, fragment: str) -> None:
    out = parse(settings, kmsg(value))
    assert isinstance(out, DlqRecord)
    assert out.error_class == error_class and fragment in out.reason
    assert (out.source_topic, out.source_partition, out.source_offset) == ("ingest.sms.p1", 2, 7)
    assert DlqCipher(KEY).decrypt(out.payload_encrypted) == (value or b"")
    assert "+14155552671" not in out.model_dump_json()


def test_tier_not_allowed_is_a_failed_event(settings: Settings) -> None:
    out = parse(settings, kmsg(body(tenant_id="mkt", tier="P0"), topic="ingest.sms.p0"),
                Tier.P0)
    assert isinstance(out, StatusEvent)
    assert out.status is Status.FAILED and out.reason == "tier_not_allowed"


def test_a_sender_the_tenant_may_not_use_is_a_failed_event(settings: Settings) -> None:
    out = parse(settings, kmsg(body(sender="BANK")))
    assert isinstance(out, StatusEvent)
    assert out.status is Status.FAILED and out.reason == "sender_not_allowed"
    ok = parse(settings, kmsg(body(sender="ACME")))
    assert isinstance(ok, Work) and ok.record.sender == "ACME"


def test_channel_without_provider_goes_to_dlq(settings: Settings) -> None:
    out = parse(settings, kmsg(body(channel="EMAIL", recipient="a@example.com"),
                               topic="ingest.email.p1"))
    assert isinstance(out, DlqRecord) and out.category == "unavailable"


def work(**kw: object) -> Work:
    rec = IngestRecord.model_validate_json(body(message_id="msg_1", accepted_at=NOW.isoformat(),
                                                **kw))
    return Work(rec, SourceRef("ingest.sms.p1", 0, 1), b"raw", b"k")


def test_hold_releases_when_due_and_survives_snapshot() -> None:
    clock = [NOW]
    w = work(attempt=2, not_before=(NOW + timedelta(seconds=5)).isoformat())
    hold = Hold(None, lambda: clock[0])
    out, discard = hold.on_item(w)
    assert list(out) == [] and discard is False
    assert hold.notify_at() == NOW + timedelta(seconds=5)
    resumed = Hold(hold.snapshot(), lambda: clock[0])
    clock[0] = NOW + timedelta(seconds=5)
    out, discard = resumed.on_notify()
    assert list(out) == [w] and discard is True


def test_hold_orders_several_pending_attempts() -> None:
    clock = [NOW]
    hold = Hold(None, lambda: clock[0])
    late = work(attempt=3, not_before=(NOW + timedelta(seconds=9)).isoformat())
    early = work(attempt=2, not_before=(NOW + timedelta(seconds=2)).isoformat())
    hold.on_item(late)
    hold.on_item(early)
    assert hold.notify_at() == NOW + timedelta(seconds=2)
    clock[0] = NOW + timedelta(seconds=3)
    out, discard = hold.on_notify()
    assert list(out) == [early] and discard is False
    assert hold.notify_at() == NOW + timedelta(seconds=9)


def test_complete_record_keeps_given_fields(settings: Settings) -> None:
    expires = (NOW + timedelta(minutes=1)).isoformat()
    rec = IngestRecord.model_validate_json(body(message_id="msg_x", accepted_at=NOW.isoformat(),
                                                expires_at=expires))
    assert complete_record(rec, SourceRef("t", 0, 0), settings) == rec


def test_encoder_routes_by_type(settings: Settings) -> None:
    enc = Encoder(settings)
    w = work()
    retry = retry_record(w, 2, NOW + timedelta(seconds=3))
    assert isinstance(retry, Retry)
    rec = enc(retry)
    assert rec.topic == "ingest.sms.p1" and rec.key == b"k"
    again = IngestRecord.model_validate_json(rec.value)
    assert again.attempt == 2 and again.not_before == NOW + timedelta(seconds=3)
    ev = enc(StatusEvent(event_id="e", message_id="msg_1", tenant_id="acme", channel="SMS",
                         tier="P1", status=Status.FAILED, occurred_at=NOW, source="x"))
    assert ev.topic == "notify.events" and ev.key == b"msg_1"
    assert ("tier", b"P1") in ev.headers


def test_settings_dedup_window_bounds() -> None:
    with pytest.raises(ValidationError, match="between 10 minutes and 24 hours"):
        Settings(content_dedup_window=timedelta(minutes=5))
    assert Settings(content_dedup_window=timedelta(hours=2)).content_dedup_window == timedelta(
        hours=2)


def test_settings_from_environment(settings: Settings) -> None:
    assert settings.tenant_by_token("t-mkt-0123456789abcdef0123456789ab").id == "mkt"
    assert settings.tenant_by_token("wrong") is None
    assert settings.ingest_topic("SMS", "P0") == "ingest.sms.p0"
    assert settings.dlq_topic(Tier.P3) == "notify.dlq.p3"


def test_sealed_records_are_opened_and_bad_seals_dead_lettered(settings: Settings) -> None:
    sealed = settings.model_copy(update={
        "ingest_encryption": IngestEncryption(keys=new_key("k1"))})
    record = IngestRecord.model_validate_json(body(message_id="msg_s"))
    payload = dump(record, envelope(sealed)).encode()
    assert b"+14155552671" not in payload and b"123456" not in payload
    w = parse(sealed, kmsg(payload))
    assert isinstance(w, Work)
    assert (w.record.recipient, w.record.variables) == ("+14155552671", {"code": "123456"})
    moved = orjson.loads(payload)
    moved["tenant_id"] = "mkt"
    out = parse(sealed, kmsg(orjson.dumps(moved)))
    assert isinstance(out, DlqRecord) and out.error_class == "sealed"
    assert "moved from another record" in out.reason and out.tenant_id == "mkt"
    unkeyed = parse(settings, kmsg(payload))
    assert isinstance(unkeyed, DlqRecord) and "no ingest key" in unkeyed.reason
    retry = Encoder(sealed)(retry_record(w, 2, NOW + timedelta(seconds=3)))
    assert b"+14155552671" not in retry.value
    assert parse(sealed, kmsg(retry.value)).record.attempt == 2
