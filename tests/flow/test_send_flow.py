"""The send dataflow under Bytewax's TestingSource/TestingSink, with 1 and 2 workers.

Kafka is replaced by the testing source and sink; Redis, Cassandra (templates) and the Twilio
emulator are the real ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.send import build_send_flow
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, StatusEvent
from notiflow.settings import Settings
from tests.helpers import accepted_counts

pytestmark = pytest.mark.flow

Runner = Callable[[Any], None]
RUNNERS: dict[str, Runner] = {
    "1-worker": lambda flow: run_main(flow),
    "2-workers": lambda flow: cluster_main(flow, [], 0, worker_count_per_proc=2),
}


@pytest.fixture(scope="module")
def template(stack: Settings) -> int:
    """Template ``flow-otp`` version 1 for tenant acme, written straight to Cassandra."""
    import asyncio

    from notiflow.adapters.cassandra_store import CassandraStore, connect
    from notiflow.templating import analyse

    body = "Flow test code {{ code }}"
    info = analyse(None, body)
    cluster, session = connect(stack)

    async def put() -> None:
        await CassandraStore(session, stack).put_template({
            "tenant_id": "acme", "template_id": "flow-otp", "version": 1, "channel": "SMS",
            "subject": None, "body": body, "variables": info.variables,
            "checksum": info.checksum, "created_at": datetime.now(UTC)})

    asyncio.run(put())
    cluster.shutdown()
    return 1


def kmsg(settings: Settings, value: bytes, offset: int, tier: Tier = Tier.P1,
         key: bytes | None = None) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=key, value=value, topic=settings.ingest_topic("SMS", tier),
                              headers=[], latency=None, offset=offset, partition=0,
                              timestamp=(1, int(datetime.now(UTC).timestamp() * 1000)))


def record(code: str, **extra: object) -> bytes:
    doc: dict[str, object] = {"channel": "SMS", "tier": "P1", "tenant_id": "acme",
                              "recipient": "+14155552671", "template_id": "flow-otp",
                              "template_version": 1, "variables": {"code": code}}
    doc.update(extra)
    return orjson.dumps(doc)


def decode(settings: Settings, out: list[OutRecord]) -> tuple[list[StatusEvent],
                                                              list[DlqRecord],
                                                              list[IngestRecord]]:
    events, dlq, retries = [], [], []
    for r in out:
        if r.topic == settings.events_topic:
            events.append(StatusEvent.model_validate_json(r.value))
        elif r.topic.startswith(settings.topic("notify.dlq.")):
            dlq.append(DlqRecord.model_validate_json(r.value))
        else:
            retries.append(IngestRecord.model_validate_json(r.value))
    return events, dlq, retries


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_batch_with_poison_duplicates_and_replay(stack: Settings, fakes: str, template: int,
                                                 runner: str) -> None:
    base = uuid.uuid4().int % 10**9
    codes = [f"{base}-{i}" for i in range(6)]
    items: list[Any] = [kmsg(stack, record(c), base + i) for i, c in enumerate(codes)]
    items.insert(2, kmsg(stack, b"\x00garbage", base + 100))
    items.append(kmsg(stack, record(codes[0]), base + 101))
    items.append(kmsg(stack, record("mid", message_id=f"msg_{base}", idempotency_key="k",
                                    accepted_at=datetime.now(UTC).isoformat()), base + 102))
    out: list[OutRecord] = []
    RUNNERS[runner](build_send_flow(stack, Tier.P1, source=TestingSource(items, batch_size=4),
                                    sink=TestingSink(out)))
    events, dlq, retries = decode(stack, out)
    by_status: dict[str, list[str]] = {}
    for e in events:
        by_status.setdefault(e.status.value, []).append(e.message_id)
    assert len(by_status["PROVIDER_ACCEPTED"]) == 7
    assert len(by_status["SUPPRESSED"]) == 1
    assert [d.error_class for d in dlq] == ["poison"]
    assert dlq[0].source_offset == base + 100
    assert retries == []
    counts = accepted_counts(fakes)
    assert all(counts[m] == 1 for m in by_status["PROVIDER_ACCEPTED"])

    replay: list[OutRecord] = []
    RUNNERS[runner](build_send_flow(stack, Tier.P1, source=TestingSource(items, batch_size=3),
                                    sink=TestingSink(replay)))
    again, _, _ = decode(stack, replay)
    assert sorted(e.message_id for e in again if e.status.value == "PROVIDER_ACCEPTED") == sorted(
        by_status["PROVIDER_ACCEPTED"])
    counts = accepted_counts(fakes)
    assert all(counts[m] == 1 for m in by_status["PROVIDER_ACCEPTED"]), "replay re-sent"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_records_not_yet_due_are_held_then_sent(stack: Settings, fakes: str, template: int,
                                                runner: str) -> None:
    base = uuid.uuid4().int % 10**9
    now = datetime.now(UTC)
    later = record(f"held-{base}", message_id=f"msg_held_{base}", attempt=2,
                   accepted_at=now.isoformat(),
                   not_before=(now + timedelta(milliseconds=600)).isoformat())
    items = [kmsg(stack, later, base), TestingSource.PAUSE(timedelta(seconds=2)),
             kmsg(stack, record(f"after-{base}"), base + 1)]
    out: list[OutRecord] = []
    RUNNERS[runner](build_send_flow(stack, Tier.P1, source=TestingSource(items),
                                    sink=TestingSink(out)))
    events, _, _ = decode(stack, out)
    held = [e for e in events if e.message_id == f"msg_held_{base}"]
    assert [e.status.value for e in held] == ["PROVIDER_ACCEPTED"]
    assert held[0].attempt == 2
    assert held[0].occurred_at >= now + timedelta(milliseconds=600)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_expired_and_failed_outcomes(stack: Settings, fakes: str, template: int,
                                     runner: str) -> None:
    base = uuid.uuid4().int % 10**9
    past = datetime.now(UTC) - timedelta(seconds=5)
    items = [
        kmsg(stack, record(f"x{base}", expires_at=past.isoformat(),
                           accepted_at=(past - timedelta(seconds=1)).isoformat()), base),
        kmsg(stack, record(f"y{base}", recipient="+15005550001"), base + 1),
        kmsg(stack, record(f"z{base}", variables={}), base + 2),
    ]
    out: list[OutRecord] = []
    RUNNERS[runner](build_send_flow(stack, Tier.P1, source=TestingSource(items),
                                    sink=TestingSink(out)))
    events, _, _ = decode(stack, out)
    got = sorted((e.status.value, e.reason) for e in events)
    assert got == [("EXPIRED", "ttl"), ("FAILED", "invalid_recipient"),
                   ("FAILED", "missing_template_variable:code")]


def test_transient_failure_schedules_a_retry(stack: Settings, fakes: str,
                                             template: int) -> None:
    import httpx

    httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": True}).raise_for_status()
    try:
        base = uuid.uuid4().int % 10**9
        out: list[OutRecord] = []
        run_main(build_send_flow(stack, Tier.P1, source=TestingSource(
            [kmsg(stack, record(f"r{base}"), base, key=b"key-1")]), sink=TestingSink(out)))
    finally:
        httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": False}).raise_for_status()
    events, _, retries = decode(stack, out)
    assert [e.status.value for e in events] == ["RETRY_PENDING"]
    assert events[0].next_attempt_at is not None
    [retry] = retries
    assert retry.attempt == 2 and retry.message_id == events[0].message_id
    assert retry.not_before == events[0].next_attempt_at
    assert next(r for r in out if r.topic == stack.ingest_topic("SMS", Tier.P1)).key == b"key-1"
