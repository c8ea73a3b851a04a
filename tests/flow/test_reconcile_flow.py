"""The reconcile dataflow under TestingSource/TestingSink (1 and 2 workers), writing to the
real Cassandra: shuffled and duplicated events converge, receipts correlate, poison is
dead-lettered."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.testing import TestingSink, TestingSource
from cassandra.cluster import Session

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.receipts.reconcile import build_reconcile_flow
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import DlqRecord, Receipt, StatusEvent
from notiflow.schemas.status import rank
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS

pytestmark = pytest.mark.flow


@pytest.fixture(scope="module")
def cql(stack: Settings) -> Session:
    cluster, session = connect(stack)
    yield session
    cluster.shutdown()


def event(mid: str, status: Status, attempt: int, at: datetime, **extra: Any) -> StatusEvent:
    return StatusEvent.model_validate({
        "event_id": f"{mid}:{status.value}:{attempt}", "message_id": mid, "tenant_id": "acme",
        "channel": "SMS", "tier": "P1", "status": status.value, "attempt": attempt,
        "occurred_at": at.isoformat(), "source": "test",
        "message": {"tenant_id": "acme", "channel": "SMS", "tier": "P1", "category": "otp",
                    "template_id": "otp", "template_version": 1, "recipient_hash": "h",
                    "recipient_masked": "+1415*****71", "accepted_at": at.isoformat()},
        **extra})


def twilio_accepted(mid: str, sid: str, at: datetime) -> StatusEvent:
    """The send flow's PROVIDER_ACCEPTED event of attempt 1 through Twilio (message ``sid``)."""
    return event(mid, Status.PROVIDER_ACCEPTED, 1, at, attempt_detail={
        "attempt_no": 1, "provider_id": "twilio", "outcome": "accepted",
        "provider_message_id": sid, "started_at": at.isoformat(),
        "completed_at": at.isoformat()})


def receipt_history(cql: Session, mid: str) -> list[str]:
    """Statuses of the message's history rows written by Twilio receipts."""
    return [r["status"] for r in cql.execute(
        "SELECT status, source FROM message_events WHERE message_id = %s", (mid,))
        if r["source"] == "receipt.twilio"]


def kmsg(topic: str, value: bytes, offset: int) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=None, value=value, topic=topic, headers=[], latency=None,
                              offset=offset, partition=0, timestamp=(1, 0))


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_shuffled_duplicated_events_converge(stack: Settings, cql: Session, runner: str) -> None:
    now = datetime.now(UTC)
    rng = random.Random(runner)
    a, b, c = (f"msg_rf_{uuid.uuid4().hex}" for _ in range(3))
    lifecycles = {
        a: ([Status.PROCESSING, Status.RETRY_PENDING, Status.PROCESSING,
             Status.PROVIDER_ACCEPTED], Status.PROVIDER_ACCEPTED),
        b: ([Status.RETRY_PENDING, Status.FAILED], Status.FAILED),
        c: ([Status.SUPPRESSED], Status.SUPPRESSED),
    }
    items: list[StatusEvent] = []
    for mid, (steps, _) in lifecycles.items():
        for i, st in enumerate(steps):
            items.append(event(mid, st, 1 + i // 2, now + timedelta(milliseconds=i)))
    items = items + items[:3]
    rng.shuffle(items)
    topic = stack.events_topic
    msgs: list[Any] = [kmsg(topic, e.model_dump_json().encode(), i) for i, e in enumerate(items)]
    msgs.insert(3, kmsg(topic, b"not an event", 999))
    out: list[OutRecord] = []
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource(msgs, batch_size=2),
                                         sink=TestingSink(out)))
    for mid, (_, final) in lifecycles.items():
        row = cql.execute("SELECT status FROM messages WHERE message_id = %s", (mid,)).one()
        assert row["status"] == final.value
    [dlq] = [DlqRecord.model_validate_json(r.value) for r in out]
    assert dlq.source_offset == 999 and dlq.error_class == "validation"
    assert dlq.tier is None and out[0].topic == stack.dlq_topic(None)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_receipts_correlate_dedup_and_park_unknowns_until_given_up(stack: Settings, cql: Session,
                                                    runner: str) -> None:
    now = datetime.now(UTC)
    mid = f"msg_rf_{uuid.uuid4().hex}"
    sid = "SM" + uuid.uuid4().hex
    accepted = twilio_accepted(mid, sid, now)

    def receipt(status: Status, event_id: str, psid: str = sid) -> bytes:
        return Receipt(provider_id="twilio", provider_event_id=f"{psid}:{event_id}",
                       provider_message_id=psid, status=status,
                       occurred_at=now).model_dump_json().encode()

    rt = stack.receipts_topic
    long_ago = now - stack.scaled(stack.receipt_park_for) - timedelta(seconds=1)
    given_up = Receipt(provider_id="twilio", provider_event_id=f"old:{sid}",
                       provider_message_id="SMneverseen", status=Status.SENT, occurred_at=now,
                       parked_since=long_ago)
    first: list[Any] = [kmsg(stack.events_topic, accepted.model_dump_json().encode(), 0)]
    second: list[Any] = [kmsg(rt, receipt(Status.DELIVERED, "d"), 1),
                         kmsg(rt, receipt(Status.SENT, "s"), 2),
                         kmsg(rt, receipt(Status.DELIVERED, "d"), 3),
                         kmsg(rt, receipt(Status.SENT, "x", psid="SMunknown"), 4),
                         kmsg(rt, given_up.model_dump_json().encode(), 5)]
    out: list[OutRecord] = []
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource(first),
                                         sink=TestingSink(out)))
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource(second),
                                         sink=TestingSink(out)))
    assert cql.execute("SELECT status FROM messages WHERE message_id = %s",
                       (mid,)).one()["status"] == "DELIVERED"
    assert sorted(receipt_history(cql, mid)) == ["DELIVERED", "SENT"]
    [parked] = [Receipt.model_validate_json(r.value) for r in out if r.topic == rt]
    assert parked.provider_message_id == "SMunknown" and parked.parked_since is not None
    assert parked.not_before is not None and parked.not_before > parked.parked_since
    [dlq] = [DlqRecord.model_validate_json(r.value) for r in out if r.topic != rt]
    assert dlq.error_class == "uncorrelated_receipt" and dlq.source_offset == 5


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_copies_of_a_receipt_in_one_batch_leave_one_history_row(
        stack: Settings, cql: Session, runner: str) -> None:
    """A provider retrying a callback: the webhook stamps each copy with its own receive
    time, and the copies reach the reconciler in one batch."""
    now = datetime.now(UTC)
    mid = f"msg_rf_{uuid.uuid4().hex}"
    sid = "SM" + uuid.uuid4().hex
    accepted = twilio_accepted(mid, sid, now)
    RUNNERS[runner](build_reconcile_flow(
        stack, source=TestingSource([kmsg(stack.events_topic,
                                          accepted.model_dump_json().encode(), 0)]),
        sink=TestingSink([])))
    copies: list[Any] = [
        kmsg(stack.receipts_topic, Receipt(
            provider_id="twilio", provider_event_id=f"{sid}:{st.value.lower()}",
            provider_message_id=sid, status=st,
            occurred_at=now + timedelta(milliseconds=i)).model_dump_json().encode(), 1 + i)
        for i, st in enumerate([Status.DELIVERED, Status.SENT, Status.DELIVERED, Status.SENT,
                                Status.DELIVERED])]
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource(copies, batch_size=10),
                                         sink=TestingSink([])))
    assert sorted(receipt_history(cql, mid)) == ["DELIVERED", "SENT"]
    assert cql.execute("SELECT status FROM messages WHERE message_id = %s",
                       (mid,)).one()["status"] == "DELIVERED"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_one_batch_mixes_rows_written_by_rank_and_by_compare_and_set(
        stack: Settings, cql: Session, runner: str) -> None:
    """A batch is applied as waves (rows read together, writes decided, then sent
    together); a row whose status cells carry an ordinary write time (a DLQ replay's
    re-queue) takes the compare-and-set path in the same batch, and both kinds advance."""
    now = datetime.now(UTC)
    replayed, fresh = (f"msg_rf_{uuid.uuid4().hex}" for _ in range(2))
    sids = {replayed: "SM" + uuid.uuid4().hex, fresh: "SM" + uuid.uuid4().hex}
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource([kmsg(
        stack.events_topic, event(replayed, Status.QUEUED, 0, now - timedelta(minutes=1))
        .model_dump_json().encode(), 0)]), sink=TestingSink([])))
    cql.execute("UPDATE messages SET status = 'QUEUED', status_rank = %s, attempt = 1 "
                "WHERE message_id = %s", (rank(Status.QUEUED), replayed))

    def receipt(mid: str) -> bytes:
        return Receipt(provider_id="twilio", provider_event_id=f"{sids[mid]}:delivered",
                       provider_message_id=sids[mid], status=Status.DELIVERED,
                       occurred_at=now, message_id=mid, attempt=1).model_dump_json().encode()

    batch: list[Any] = [
        kmsg(stack.events_topic, twilio_accepted(replayed, sids[replayed], now)
             .model_dump_json().encode(), 1),
        kmsg(stack.events_topic, twilio_accepted(fresh, sids[fresh], now)
             .model_dump_json().encode(), 2),
        kmsg(stack.receipts_topic, receipt(replayed), 3),
        kmsg(stack.receipts_topic, receipt(fresh), 4)]
    out: list[OutRecord] = []
    RUNNERS[runner](build_reconcile_flow(stack, source=TestingSource(batch, batch_size=10),
                                         sink=TestingSink(out)))
    assert out == []
    for mid in (replayed, fresh):
        head = cql.execute("SELECT status, WRITETIME(tenant_id) AS c, WRITETIME(status_rank) "
                           "AS s FROM messages WHERE message_id = %s", (mid,)).one()
        assert head["status"] == "DELIVERED"
        assert (head["s"] - head["c"] <= 130_000) == (mid == fresh)
        assert receipt_history(cql, mid) == ["DELIVERED"]
        [attempt] = cql.execute("SELECT provider_message_id FROM attempts "
                                "WHERE message_id = %s", (mid,)).all()
        assert attempt["provider_message_id"] == sids[mid]
