"""One message end to end on the real stack: API or direct producer → send flow → Twilio
emulator → notify.events → reconcile → Cassandra."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from cassandra.cluster import Session

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import StatusEvent, derived_message_id
from notiflow.settings import Settings
from tests.helpers import (
    SUCCESS,
    accepted_counts,
    emulator_records,
    message_row,
    produce,
    read_topic,
    wait_for,
)

pytestmark = pytest.mark.integration
NUMBERS = ["+14155552671", "+12025550143", "+447911123456", "+33612345678", "+61412345678"]


def direct(settings: Settings, tier: Tier, version: int, *, tenant: str = "acme",
           code: str | None = None, recipient: str | None = None, **extra: object) -> OutRecord:
    """An ingest record as an upstream producer writes it (no message id, no accepted_at)."""
    doc: dict[str, object] = {
        "channel": "SMS", "tier": tier.value, "tenant_id": tenant, "template_id": "otp",
        "template_version": version, "recipient": recipient or random.choice(NUMBERS),
        "variables": {"code": code or uuid.uuid4().hex[:6]}}
    doc.update(extra)
    return OutRecord(settings.ingest_topic("SMS", tier), None, orjson.dumps(doc))


def ids_of(settings: Settings, tier: Tier, placed: list[tuple[int, int]]) -> list[str]:
    topic = settings.ingest_topic("SMS", tier)
    return [derived_message_id("kafka", topic, str(p), str(o)) for p, o in placed]


def terminal(cql: Session, ids: list[str]) -> dict[str, str] | None:
    """message_id → outcome once every message has one; provider success (accepted, sent,
    delivered) reads as PROVIDER_ACCEPTED."""
    rows = {mid: message_row(cql, mid) for mid in ids}
    done = {mid: "PROVIDER_ACCEPTED" if r["status"] in SUCCESS else r["status"]
            for mid, r in rows.items()
            if r and r["status"] in SUCCESS | {"FAILED", "EXPIRED", "SUPPRESSED"}}
    return done if len(done) == len(ids) else None


def test_api_message_reaches_provider_and_cassandra(
        api: str, tokens: dict[str, str], otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session, fakes: str) -> None:
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {tokens['acme']}", "Idempotency-Key": uuid.uuid4().hex},
        json={"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
              "template_id": "otp", "template_version": otp_template["acme"],
              "variables": {"code": "424242"}})
    assert r.status_code == 202, r.text
    mid = r.json()["message_id"]
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") in SUCCESS,
             what="provider acceptance")
    got = httpx.get(f"{api}/v1/messages/{mid}",
                    headers={"Authorization": f"Bearer {tokens['acme']}"}).json()
    assert got["status"] in SUCCESS
    assert got["attempts"][0]["provider_id"] == "twilio"
    assert got["attempts"][0]["provider_message_id"].startswith("SM")
    [rec] = emulator_records(fakes, mid)
    assert rec["body"] == "Your code is 424242"
    row = message_row(cql, mid)
    assert row["recipient_masked"] != "+14155552671" and "+14155552671" not in str(row)


def test_direct_producer_path(stack: Settings, otp_template: dict[str, int],
                              send_p1: ManagedProcess, cql: Session) -> None:
    placed = produce(stack, [direct(stack, Tier.P1, otp_template["acme"])])
    [mid] = ids_of(stack, Tier.P1, placed)
    done = wait_for(lambda: terminal(cql, [mid]), what="terminal status")
    assert done[mid] == "PROVIDER_ACCEPTED"
    row = message_row(cql, mid)
    assert row["tenant_id"] == "acme" and row["tier"] == "P1"
    events = [e["status"] for e in cql.execute(
        "SELECT status FROM message_events WHERE message_id = %s", (mid,))]
    assert events[0] == "QUEUED" and "PROVIDER_ACCEPTED" in events


def test_same_content_twice_in_window_is_suppressed(
        stack: Settings, otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session) -> None:
    rec = direct(stack, Tier.P1, otp_template["acme"], code="777777", recipient="+12125551234")
    other = direct(stack, Tier.P1, otp_template["acme"], code="777778",
                   recipient="+12125551234")
    placed = produce(stack, [rec, rec, other])
    ids = ids_of(stack, Tier.P1, placed)
    done = wait_for(lambda: terminal(cql, ids), what="terminal statuses")
    assert sorted([done[ids[0]], done[ids[1]]]) == ["PROVIDER_ACCEPTED", "SUPPRESSED"]
    assert done[ids[2]] == "PROVIDER_ACCEPTED"
    suppressed = next(i for i in ids[:2] if done[i] == "SUPPRESSED")
    assert message_row(cql, suppressed)["reason"].startswith("duplicate_content_of:")


def test_malformed_record_goes_to_dlq_and_next_one_is_delivered(
        stack: Settings, otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session) -> None:
    topic = stack.ingest_topic("SMS", Tier.P1)
    poison = OutRecord(topic, b"poison", b'{"channel": "SMS", "tier": ')
    good = direct(stack, Tier.P1, otp_template["acme"])
    placed = produce(stack, [poison, good])
    good_id = ids_of(stack, Tier.P1, placed[1:])[0]
    assert wait_for(lambda: terminal(cql, [good_id]))[good_id] == "PROVIDER_ACCEPTED"

    def find_dlq() -> dict[str, object] | None:
        for m in read_topic(stack, stack.dlq_topic(Tier.P1)):
            doc = orjson.loads(m.value())
            if (doc["source_topic"], doc["source_partition"], doc["source_offset"]) == (
                    topic, *placed[0]):
                return doc
        return None

    dlq = wait_for(find_dlq, what="DLQ record")
    assert dlq["error_class"] == "poison" and "not JSON" in dlq["reason"]
    assert dlq["tier"] == "P1"
    assert DlqCipher.from_settings(stack).decrypt(dlq["payload_encrypted"]) == poison.value


def test_permanent_provider_error_is_failed(stack: Settings, otp_template: dict[str, int],
                                            send_p1: ManagedProcess, cql: Session) -> None:
    placed = produce(stack, [direct(stack, Tier.P1, otp_template["acme"],
                                    recipient="+15005550001")])
    [mid] = ids_of(stack, Tier.P1, placed)
    assert wait_for(lambda: terminal(cql, [mid]))[mid] == "FAILED"
    row = message_row(cql, mid)
    assert row["reason"] == "invalid_recipient"
    assert row["attempt"] == 1


def test_missing_variable_and_unknown_template_fail_without_provider_call(
        stack: Settings, otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session, fakes: str) -> None:
    rec_missing = direct(stack, Tier.P1, otp_template["acme"], variables={})
    rec_unknown = direct(stack, Tier.P1, 999)
    ids = ids_of(stack, Tier.P1, produce(stack, [rec_missing, rec_unknown]))
    done = wait_for(lambda: terminal(cql, ids))
    assert done == dict.fromkeys(ids, "FAILED")
    assert message_row(cql, ids[0])["reason"] == "missing_template_variable:code"
    assert message_row(cql, ids[1])["reason"] == "unknown_template"
    assert not any(accepted_counts(fakes).get(i) for i in ids)


def test_tier_not_allowed_on_ingest_path(stack: Settings, otp_template: dict[str, int],
                                         send_p0: ManagedProcess, cql: Session) -> None:
    ids = ids_of(stack, Tier.P0, produce(stack, [direct(stack, Tier.P0, otp_template["mkt"],
                                                        tenant="mkt")]))
    assert wait_for(lambda: terminal(cql, ids))[ids[0]] == "FAILED"
    assert message_row(cql, ids[0])["reason"] == "tier_not_allowed"


def test_status_never_regresses_with_shuffled_events(stack: Settings, reconciler: ManagedProcess,
                                                     cql: Session, api: str,
                                                     tokens: dict[str, str],
                                                     otp_template: dict[str, int]) -> None:
    """Events for one message arrive duplicated and out of order; the row ends at the highest
    status and history keeps every event."""
    mid = f"msg_test_{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    base = {"message_id": mid, "tenant_id": "acme", "channel": "SMS", "tier": "P2",
            "occurred_at": now.isoformat(), "source": "test",
            "message": {"tenant_id": "acme", "channel": "SMS", "tier": "P2",
                        "category": "account", "template_id": "otp", "template_version": 1,
                        "recipient_hash": "h", "recipient_masked": "+1415*****71",
                        "accepted_at": now.isoformat()}}
    order = [Status.DELIVERED, Status.PROCESSING, Status.SENT, Status.FAILED,
             Status.PROVIDER_ACCEPTED, Status.RETRY_PENDING, Status.DELIVERED]
    records = []
    for i, st in enumerate(order):
        ev = StatusEvent.model_validate({**base, "status": st.value, "attempt": 1,
                                         "event_id": f"{mid}:{i}"})
        records.append(OutRecord(stack.events_topic, mid.encode(),
                                 ev.model_dump_json().encode(),
                                 make_headers(mid, "acme", "P2")))
    for rec in records:
        produce(stack, [rec])
    wait_for(lambda: len(list(cql.execute(
        "SELECT event_id FROM message_events WHERE message_id = %s", (mid,)))) >= len(order),
        what="all events recorded")
    assert message_row(cql, mid)["status"] == "DELIVERED"
    r = httpx.get(f"{api}/v1/messages/{mid}",
                  headers={"Authorization": f"Bearer {tokens['globex']}"})
    assert r.status_code == 404


def test_a_tenants_sender_is_what_the_recipient_sees(
        api: str, tokens: dict[str, str], otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session, fakes: str) -> None:
    headers = {"Authorization": f"Bearer {tokens['acme']}"}
    r = httpx.post(f"{api}/v1/templates", headers=headers, json={
        "template_id": f"sender-{uuid.uuid4().hex[:8]}", "channel": "EMAIL", "version": 1,
        "subject": "Receipt", "body": "Thanks"})
    assert r.status_code in (200, 201), r.text
    sms = {"channel": "SMS", "tier": "P1", "recipient": "+14155552671", "template_id": "otp",
           "template_version": otp_template["acme"], "variables": {"code": "111222"}}
    email = {"channel": "EMAIL", "tier": "P1", "recipient": "ana@example.com",
             "template_id": r.json()["template_id"], "template_version": 1}
    sent = {}
    for sender, body in (("ACME", sms), ("Billing@ACME.example", email)):
        r = httpx.post(f"{api}/v1/messages", headers={**headers, "Idempotency-Key":
                                                      uuid.uuid4().hex},
                       json={**body, "sender": sender})
        assert r.status_code == 202, r.text
        sent[r.json()["message_id"]] = body["channel"]
    refused = httpx.post(f"{api}/v1/messages", headers=headers,
                         json={**sms, "sender": "EVILBANK"})
    assert (refused.status_code, refused.json()["reason"]) == (403, "sender_not_allowed")
    wait_for(lambda: all((message_row(cql, m) or {}).get("status") in SUCCESS for m in sent),
             what="provider acceptance")
    for mid, channel in sent.items():
        providers = ("twilio", "vonage") if channel == "SMS" else ("sendgrid", "smtp")
        [rec] = [r for r in emulator_records(fakes, mid, providers) if r["outcome"] == "accepted"]
        seen = rec.get("header_from") or rec["from"]
        assert seen == ("ACME" if channel == "SMS" else "Billing@acme.example"), rec


def test_a_sender_the_tenant_may_not_use_fails_on_the_ingest_path(
        stack: Settings, otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session, fakes: str) -> None:
    ids = ids_of(stack, Tier.P1, produce(stack, [
        direct(stack, Tier.P1, otp_template["acme"], sender="EVILBANK"),
        direct(stack, Tier.P1, otp_template["acme"], sender="+14155550100")]))
    done = wait_for(lambda: terminal(cql, ids), what="terminal status")
    assert done == {ids[0]: "FAILED", ids[1]: "PROVIDER_ACCEPTED"}
    assert message_row(cql, ids[0])["reason"] == "sender_not_allowed"
    assert not emulator_records(fakes, ids[0])
    [rec] = [r for r in emulator_records(fakes, ids[1]) if r["outcome"] == "accepted"]
    assert rec["from"] in ("+14155550100", "14155550100")
