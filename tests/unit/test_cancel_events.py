"""The API's CANCELLED event (``gateway/cancel.py``) as the other flows read it: a
``notify.events`` record with the contract headers and the message's snapshot, announced once
by the client-webhook flow (the send flow's own CANCELLED of the same message is not sent
again), and merged by the reconciler like any terminal status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Network

import orjson
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet

from notiflow.adapters.cassandra.messages import message_row
from notiflow.adapters.kafka_io import OutRecord, header
from notiflow.adapters.rows import MessageRow
from notiflow.flows.webhooks.status_webhooks import WebhookLogic, WebhookPolicy, parse_change
from notiflow.flows.webhooks.webhook_resolve import Resolver
from notiflow.gateway.cancel import cancel_record, snapshot_of_row
from notiflow.schemas.enums import TERMINAL_STATUSES, Status
from notiflow.schemas.messages import StatusEvent
from notiflow.schemas.status import rank
from notiflow.settings import EgressSettings, Settings, TenantConfig
from tests.fakes import ManualClock
from tests.unit.test_client_webhooks_pure import START, VECTOR_SECRET, FakeSender, status_of

AT = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def settings() -> Settings:
    return Settings(tenants=[TenantConfig(id="acme", token="t" * 32,
                                          webhook_secrets=[VECTOR_SECRET])],
                    dlq_key=Fernet.generate_key().decode(),
                    egress=EgressSettings(allow_http=True,
                                          allow_networks=(IPv4Network("127.0.0.0/8"),)))


def row(**over: object) -> MessageRow:
    """A ``messages`` row as the driver returns it (naive UTC timestamps), mapped."""
    naive = AT.replace(tzinfo=None)
    r: dict[str, object] = {
        "message_id": "msg_c", "tenant_id": "acme", "channel": "SMS", "tier": "P2",
        "category": "account", "recipient_hash": "h" * 16, "recipient_masked": "+1415***71",
        "template_id": "otp", "template_version": 1, "idempotency_key": None,
        "ordering_key": None, "status_webhook": "http://127.0.0.1:9/hook", "status": "QUEUED",
        "status_rank": rank(Status.QUEUED), "attempt": 0, "accepted_at": naive,
        "expires_at": naive + timedelta(hours=4), "scheduled_at": None, "updated_at": naive}
    r.update(over)
    return message_row(r)


def kafka(rec: OutRecord) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=rec.key, value=rec.value, topic=rec.topic,
                              headers=rec.headers, latency=None, offset=3, partition=0,
                              timestamp=(1, 0))


def test_the_record_carries_the_contract_headers_and_the_snapshot() -> None:
    s = settings()
    rec = cancel_record(s, row(), "msg_c", AT, TRACE)
    assert (rec.topic, rec.key) == (s.events_topic, b"msg_c")
    assert [header(rec.headers, h) for h in ("message_id", "tenant_id", "tier",
                                              "traceparent")] == ["msg_c", "acme", "P2", TRACE]
    ev = StatusEvent.model_validate_json(rec.value)
    assert (ev.status, ev.reason, ev.source, ev.occurred_at) == (
        Status.CANCELLED, "cancelled", "api", AT)
    assert ev.event_id == "msg_c:CANCELLED:0"
    assert ev.message is not None and ev.message.accepted_at == AT
    assert ev.message.status_webhook == "http://127.0.0.1:9/hook"
    assert Status.CANCELLED in TERMINAL_STATUSES


def test_a_row_missing_snapshot_fields_gives_an_event_without_snapshot() -> None:
    assert snapshot_of_row(row(recipient_hash=None)) is None
    ev = StatusEvent.model_validate_json(
        cancel_record(settings(), row(recipient_hash=None), "msg_c", AT, TRACE).value)
    assert ev.message is None and ev.status is Status.CANCELLED


def test_the_client_webhook_announces_cancelled_once() -> None:
    s, sender, clock = settings(), FakeSender(), ManualClock(START)
    clock.now = AT + timedelta(seconds=1)
    api = parse_change(kafka(cancel_record(s, row(), "msg_c", AT, TRACE)), s.receipts_topic)
    flow_ev = StatusEvent.model_validate_json(cancel_record(
        s, row(attempt=2), "msg_c", AT + timedelta(seconds=1), TRACE).value)
    later = parse_change(kafka(OutRecord(s.events_topic, b"msg_c", orjson.dumps(
        flow_ev.model_dump(mode="json") | {"source": "send.p2"}))), s.receipts_topic)
    assert api is not None and later is not None and api.resolved
    lg = WebhookLogic(None, sender=sender, settings=s, policy=WebhookPolicy.from_settings(s),
                      cipher=None, clock=clock)  # type: ignore[arg-type]
    for job in Resolver(s)([api, later]):
        lg.on_item(job)
    assert [status_of(r) for r, _ in sender.requests] == ["CANCELLED"]
    sender.answer(200)
    lg.on_notify()
    assert len(sender.requests) == 1 and not lg.st.pending


def test_no_webhook_no_announcement() -> None:
    s = settings()
    rec = cancel_record(s, row(status_webhook=None), "msg_c", AT, TRACE)
    assert parse_change(kafka(rec), s.receipts_topic) is None
