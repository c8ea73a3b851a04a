"""Cancellation in the send dataflow (1 and 2 workers) on memory ports: a message whose
cancel gate says ``cancelled`` ends CANCELLED and never reaches a provider (also on
replay); a sent message keeps the gate ``sending`` (its cancel is refused); an attempt that
ends RETRY_PENDING clears the gate, so a cancel while the message waits stops its next
attempt. The gate's Redis scripts are checked against the same model in
``tests/integration/test_redis_cancel_gate.py``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from bytewax.testing import TestingSource

from notiflow.adapters.cancel_gate import SENDING
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, kmsg, record

pytestmark = pytest.mark.flow
SMS = ("twilio", "vonage")


def api_record(message_id: str, code: str, **extra: object) -> bytes:
    return record(code, message_id=message_id, accepted_at=datetime.now(UTC).isoformat(),
                  **extra)


def sent(mem: MemorySend, message_id: str) -> list[object]:
    return [c for p in SMS for c in mem.state.provider(p).sent(message_id)]


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_cancelled_message_is_never_sent_and_ends_cancelled(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**9
    gone, kept = f"msg_cancel_{base}", f"msg_keep_{base}"
    assert mem.state.cancel(gone, timedelta(minutes=5))
    items = [kmsg(settings, api_record(gone, f"c{base}"), base),
             kmsg(settings, api_record(kept, f"k{base}"), base + 1)]
    events, dlq, retries = mem.run(runner, items)
    got = sorted((e.message_id, e.status.value, e.reason) for e in events)
    assert got == [(gone, "CANCELLED", "cancelled"), (kept, "PROVIDER_ACCEPTED", None)]
    assert (dlq, retries) == ([], [])
    assert sent(mem, gone) == []
    assert mem.state.gate(kept) == SENDING and not mem.state.cancel(kept)

    again, _, _ = mem.run(runner, items)
    assert sorted((e.message_id, e.status.value) for e in again) == [
        (gone, "CANCELLED"), (kept, "PROVIDER_ACCEPTED")]
    assert sent(mem, gone) == []
    assert mem.state.accepted_counts()[kept] == 1


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_retry_pending_clears_the_gate_and_a_cancel_stops_the_next_attempt(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**9
    mid = f"msg_retry_cancel_{base}"
    for p in SMS:
        mem.state.provider(p).outage()
    events, _, retries = mem.run(runner, [kmsg(settings, api_record(mid, f"r{base}"), base)])
    for p in SMS:
        mem.state.provider(p).outage(False)
    assert [e.status.value for e in events] == ["RETRY_PENDING"]
    assert mem.state.gate(mid) is None
    assert mem.state.cancel(mid, timedelta(minutes=5))

    [retry] = retries
    assert retry.not_before is not None
    assert retry.not_before - datetime.now(UTC) < timedelta(seconds=1)
    after, _, more = mem.run(runner, [
        kmsg(settings, retry.model_dump_json(exclude_none=True).encode(), base + 1),
        TestingSource.PAUSE(timedelta(seconds=1))])
    assert [(e.status.value, e.attempt) for e in after] == [("CANCELLED", 2)]
    assert more == []
    assert all(c.result.outcome.value != "accepted"
               for p in SMS for c in mem.state.provider(p).sent(mid))
