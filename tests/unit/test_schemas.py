"""Wire contracts: validation, limits and round trips."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from notiflow.schemas.enums import Category, Channel, PushPlatform, Status, Tier
from notiflow.schemas.messages import (
    MAX_VARIABLES,
    AttemptRecord,
    DlqRecord,
    IngestRecord,
    MessageSnapshot,
    PushRecipient,
    Receipt,
    SendRequest,
    StatusEvent,
    derived_message_id,
    json_schemas,
    new_message_id,
)

NOW = datetime(2026, 8, 15, 10, 0, tzinfo=UTC)


def sms(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "channel": "SMS", "tier": "P1", "recipient": "+14155552671",
        "template_id": "order-confirmed", "template_version": 7,
        "variables": {"order_id": "981", "eta": "30 minutes"},
    }
    base.update(kw)
    return base


def test_seed_example_validates() -> None:
    req = SendRequest.model_validate(sms(
        expires_at="2026-08-15T10:10:00Z", ordering_key="order:981",
        status_webhook="https://orders.internal/message-status"))
    assert req.channel is Channel.SMS and req.tier is Tier.P1
    assert req.category is Category.TRANSACTIONAL
    assert req.expires_at == datetime(2026, 8, 15, 10, 10, tzinfo=UTC)


@pytest.mark.parametrize("phone", ["14155552671", "+1415555", "+447700900123", "+0123456789",
                                   "+1 415 555 2671", ""])
def test_bad_phone_numbers_rejected(phone: str) -> None:
    with pytest.raises(ValidationError) as exc:
        SendRequest.model_validate(sms(recipient=phone))
    assert "phone number" in str(exc.value)


def test_email_normalised_and_bad_email_rejected() -> None:
    req = SendRequest.model_validate(sms(channel="EMAIL", recipient="Jane.Doe@Example.COM"))
    assert req.recipient == "Jane.Doe@example.com"
    with pytest.raises(ValidationError, match="invalid email"):
        SendRequest.model_validate(sms(channel="EMAIL", recipient="not-an-email"))


def test_push_tokens() -> None:
    apns = {"device_token": "ab" * 32, "platform": "ios"}
    req = SendRequest.model_validate(sms(channel="PUSH", recipient=apns))
    assert isinstance(req.recipient, PushRecipient)
    assert req.recipient.platform is PushPlatform.IOS
    fcm = {"device_token": "dGVzdA:APA91b" + "x" * 140, "platform": "android"}
    SendRequest.model_validate(sms(channel="PUSH", recipient=fcm))
    with pytest.raises(ValidationError, match="not a valid ios token"):
        SendRequest.model_validate(sms(channel="PUSH", recipient={
            "device_token": "zz" * 32, "platform": "ios"}))
    with pytest.raises(ValidationError, match="PUSH recipient"):
        SendRequest.model_validate(sms(channel="PUSH", recipient="+14155552671"))
    with pytest.raises(ValidationError, match="must be a string"):
        SendRequest.model_validate(sms(recipient=apns))


def test_datetimes_must_be_timezone_aware() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        SendRequest.model_validate(sms(expires_at="2026-08-15T10:10:00"))


def test_scheduling_only_for_p2_p3_and_before_expiry() -> None:
    with pytest.raises(ValidationError, match="P2 and P3 only"):
        SendRequest.model_validate(sms(scheduled_at="2026-08-15T11:00:00Z"))
    with pytest.raises(ValidationError, match="before expires_at"):
        SendRequest.model_validate(sms(tier="P3", scheduled_at="2026-08-15T11:00:00Z",
                                       expires_at="2026-08-15T10:30:00Z"))
    SendRequest.model_validate(sms(tier="P3", scheduled_at="2026-08-15T11:00:00Z"))


def test_size_limits() -> None:
    with pytest.raises(ValidationError, match="at most"):
        SendRequest.model_validate(sms(variables={f"v{i}": i for i in range(MAX_VARIABLES + 1)}))
    with pytest.raises(ValidationError, match="longer than"):
        SendRequest.model_validate(sms(variables={"v": "x" * 5000}))
    with pytest.raises(ValidationError, match="larger than"):
        SendRequest.model_validate(sms(variables={f"v{i}": "x" * 4000 for i in range(5)}))
    with pytest.raises(ValidationError, match="invalid variable name"):
        SendRequest.model_validate(sms(variables={"not-valid": 1}))
    with pytest.raises(ValidationError):
        SendRequest.model_validate(sms(template_id="Bad Template"))
    with pytest.raises(ValidationError):
        SendRequest.model_validate(sms(ordering_key="k" * 257))


def test_unknown_fields_rejected() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        SendRequest.model_validate(sms(priority="high"))


def test_ingest_record_round_trip() -> None:
    rec = IngestRecord.model_validate(sms(tenant_id="acme", message_id=new_message_id(),
                                          accepted_at=NOW, idempotency_key="k-1"))
    again = IngestRecord.model_validate_json(rec.model_dump_json(exclude_none=True))
    assert again == rec
    assert again.request() == SendRequest.model_validate(sms())
    assert again.schema_version == 1 and again.attempt == 1


def test_derived_ids_are_stable() -> None:
    assert derived_message_id("a", "b") == derived_message_id("a", "b")
    assert derived_message_id("a", "b") != derived_message_id("a", "c")
    assert new_message_id() != new_message_id()


def test_event_receipt_dlq_round_trip() -> None:
    attempt = AttemptRecord(attempt_no=1, provider_id="twilio", outcome="accepted",
                            provider_message_id="SM" + "0" * 32, started_at=NOW,
                            completed_at=NOW + timedelta(milliseconds=40))
    snap = MessageSnapshot(tenant_id="acme", channel=Channel.SMS, tier=Tier.P1,
                           category=Category.OTP, template_id="otp", template_version=1,
                           recipient_hash="h", recipient_masked="+1415*****71", accepted_at=NOW)
    ev = StatusEvent(event_id="e", message_id="msg_1", tenant_id="acme", channel=Channel.SMS,
                     tier=Tier.P1, status=Status.PROVIDER_ACCEPTED, attempt=1, occurred_at=NOW,
                     source="send.p1", attempt_detail=attempt, message=snap)
    assert StatusEvent.model_validate_json(ev.model_dump_json()) == ev
    rc = Receipt(provider_id="twilio", provider_event_id="x", provider_message_id="SM1",
                 status=Status.DELIVERED, occurred_at=NOW)
    assert Receipt.model_validate_json(rc.model_dump_json()) == rc
    with pytest.raises(ValidationError):
        Receipt(provider_id="twilio", provider_event_id="x", provider_message_id="SM1",
                status=Status.QUEUED, occurred_at=NOW)
    dlq = DlqRecord(dlq_id="d", tier=Tier.P0, reason="r", error_class="poison",
                    category="invalid_data", failed_at=NOW, source_topic="t",
                    source_partition=0, source_offset=5, payload_encrypted="x")
    assert DlqRecord.model_validate_json(dlq.model_dump_json()) == dlq


def test_json_schema_export_covers_contracts() -> None:
    schemas = json_schemas()
    assert {"send_request", "ingest_record", "status_event", "receipt", "dlq_record"} <= set(
        schemas)
    assert "recipient" in schemas["send_request"]["properties"]
    json.dumps(schemas)


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
                       st.one_of(st.text(max_size=50), st.integers(), st.booleans(),
                                 st.none()), max_size=10))
def test_variables_round_trip(variables: dict[str, object]) -> None:
    rec = IngestRecord.model_validate(sms(tenant_id="acme", variables=variables))
    assert IngestRecord.model_validate_json(rec.model_dump_json()).variables == variables


def test_exported_json_schemas_are_current() -> None:
    """``schemas/json/`` is what upstream producers read: it must match the models
    (regenerate with ``notiflow schemas export``)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "notiflow" / "schemas" / "json"
    for name, schema in json_schemas().items():
        stored = json.loads((folder / f"{name}.schema.json").read_text())
        assert stored == schema, f"{name}.schema.json is stale: run `notiflow schemas export`"
