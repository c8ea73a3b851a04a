"""The send dataflow under Bytewax's TestingSource/TestingSink, with 1 and 2 workers, on
memory ports (``adapters/memory``): no server is needed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bytewax.testing import TestingSource

from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.memory import Answer
from notiflow.adapters.providers.base import Outcome
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, decode, kmsg, record

pytestmark = pytest.mark.flow

INVALID = "+15005550001"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_batch_with_poison_duplicates_and_replay(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**9
    codes = [f"{base}-{i}" for i in range(6)]
    items: list[Any] = [kmsg(settings, record(c), base + i) for i, c in enumerate(codes)]
    items.insert(2, kmsg(settings, b"\x00garbage", base + 100))
    items.append(kmsg(settings, record(codes[0]), base + 101))
    items.append(kmsg(settings, record("mid", message_id=f"msg_{base}", idempotency_key="k",
                                       accepted_at=datetime.now(UTC).isoformat()), base + 102))
    events, dlq, retries = mem.run(runner, items, batch_size=4)
    by_status: dict[str, list[str]] = {}
    for e in events:
        by_status.setdefault(e.status.value, []).append(e.message_id)
    assert len(by_status["PROVIDER_ACCEPTED"]) == 7
    assert len(by_status["SUPPRESSED"]) == 1
    assert [d.error_class for d in dlq] == ["poison"]
    assert dlq[0].source_offset == base + 100
    assert retries == []
    counts = mem.state.accepted_counts()
    assert all(counts[m] == 1 for m in by_status["PROVIDER_ACCEPTED"])

    again, _, _ = mem.run(runner, items, batch_size=3)
    assert sorted(e.message_id for e in again if e.status.value == "PROVIDER_ACCEPTED") == sorted(
        by_status["PROVIDER_ACCEPTED"])
    counts = mem.state.accepted_counts()
    assert all(counts[m] == 1 for m in by_status["PROVIDER_ACCEPTED"]), "replay re-sent"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_records_not_yet_due_are_held_then_sent(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**9
    now = datetime.now(UTC)
    later = record(f"held-{base}", message_id=f"msg_held_{base}", attempt=2,
                   accepted_at=now.isoformat(),
                   not_before=(now + timedelta(milliseconds=600)).isoformat())
    items = [kmsg(settings, later, base), TestingSource.PAUSE(timedelta(seconds=2)),
             kmsg(settings, record(f"after-{base}"), base + 1)]
    events, _, _ = mem.run(runner, items)
    held = [e for e in events if e.message_id == f"msg_held_{base}"]
    assert [e.status.value for e in held] == ["PROVIDER_ACCEPTED"]
    assert held[0].attempt == 2
    assert held[0].occurred_at >= now + timedelta(milliseconds=600)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_expired_and_failed_outcomes(settings: Settings,
                                     memory_send: Callable[..., MemorySend],
                                     runner: str) -> None:
    mem = memory_send()
    for p in ("twilio", "vonage"):
        mem.state.provider(p).script(rule=lambda m: Answer(
            Outcome.PERMANENT, "invalid_recipient") if m.recipient == INVALID else None)
    base = uuid.uuid4().int % 10**9
    past = datetime.now(UTC) - timedelta(seconds=5)
    items = [
        kmsg(settings, record(f"x{base}", expires_at=past.isoformat(),
                              accepted_at=(past - timedelta(seconds=1)).isoformat()), base),
        kmsg(settings, record(f"y{base}", recipient=INVALID), base + 1),
        kmsg(settings, record(f"z{base}", variables={}), base + 2),
    ]
    events, _, _ = mem.run(runner, items)
    got = sorted((e.status.value, e.reason) for e in events)
    assert got == [("EXPIRED", "ttl"), ("FAILED", "invalid_recipient"),
                   ("FAILED", "missing_template_variable:code")]


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_transient_failure_schedules_a_retry(settings: Settings,
                                             memory_send: Callable[..., MemorySend],
                                             runner: str) -> None:
    mem = memory_send()
    for p in ("twilio", "vonage"):
        mem.state.provider(p).outage()
    base = uuid.uuid4().int % 10**9
    out: list[OutRecord] = []
    RUNNERS[runner](mem.flow(TestingSource([kmsg(settings, record(f"r{base}"), base,
                                                  key=b"key-1")]), out))
    events, _, retries = decode(settings, out)
    assert [e.status.value for e in events] == ["RETRY_PENDING"]
    assert events[0].next_attempt_at is not None
    [retry] = retries
    assert retry.attempt == 2 and retry.message_id == events[0].message_id
    assert retry.not_before == events[0].next_attempt_at
    assert next(r for r in out if r.topic == settings.ingest_topic("SMS", Tier.P1)).key == b"key-1"
