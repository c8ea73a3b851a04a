"""The send dataflow under Bytewax's TestingSource/TestingSink, with 1 and 2 workers.

Kafka is replaced by the testing source and sink; Redis, Cassandra (templates) and the Twilio
emulator are the real ones.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bytewax.testing import TestingSource, run_main

from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, decode, kmsg, record, send_flow
from tests.helpers import accepted_counts

pytestmark = pytest.mark.flow

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
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items, batch_size=4), out))
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
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items, batch_size=3), replay))
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
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items), out))
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
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items), out))
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
        run_main(send_flow(stack, Tier.P1, TestingSource(
            [kmsg(stack, record(f"r{base}"), base, key=b"key-1")]), out))
    finally:
        httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": False}).raise_for_status()
    events, _, retries = decode(stack, out)
    assert [e.status.value for e in events] == ["RETRY_PENDING"]
    assert events[0].next_attempt_at is not None
    [retry] = retries
    assert retry.attempt == 2 and retry.message_id == events[0].message_id
    assert retry.not_before == events[0].next_attempt_at
    assert next(r for r in out if r.topic == stack.ingest_topic("SMS", Tier.P1)).key == b"key-1"
