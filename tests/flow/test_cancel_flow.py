"""Cancellation in the send dataflow (1 and 2 workers): a message whose cancel gate says
``cancelled`` ends CANCELLED and never reaches a provider (also on replay); a sent message
keeps the gate ``sending`` (its cancel is refused); an attempt that ends RETRY_PENDING clears
the gate, so a cancel while the message waits stops its next attempt.

Kafka is replaced by the testing source and sink; Redis, Cassandra (templates) and the SMS
emulators are the real ones.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from bytewax.testing import TestingSource, run_main

from notiflow.adapters.cancel_gate import SENDING, CancelGate, gate_key
from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, decode, kmsg, record, send_flow
from tests.helpers import accepted_counts, emulator_records

pytestmark = pytest.mark.flow


def cancel(settings: Settings, message_id: str) -> bool:
    """What ``DELETE /v1/messages/{id}`` does to the gate."""
    async def run() -> bool:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
        try:
            return await CancelGate(client, settings.topic_prefix).cancel(
                message_id, timedelta(minutes=5))
        finally:
            await client.aclose()

    return asyncio.run(run())


def gate(settings: Settings, message_id: str) -> str | None:
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        value = client.get(gate_key(settings.topic_prefix, message_id))
        return None if value is None else str(value)
    finally:
        client.close()


def api_record(message_id: str, code: str, **extra: object) -> bytes:
    return record(code, message_id=message_id, accepted_at=datetime.now(UTC).isoformat(),
                  **extra)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_cancelled_message_is_never_sent_and_ends_cancelled(
        stack: Settings, fakes: str, template: int, runner: str) -> None:
    base = uuid.uuid4().int % 10**9
    gone, kept = f"msg_cancel_{base}", f"msg_keep_{base}"
    assert cancel(stack, gone)
    items = [kmsg(stack, api_record(gone, f"c{base}"), base),
             kmsg(stack, api_record(kept, f"k{base}"), base + 1)]
    out: list[OutRecord] = []
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items), out))
    events, dlq, retries = decode(stack, out)
    got = sorted((e.message_id, e.status.value, e.reason) for e in events)
    assert got == [(gone, "CANCELLED", "cancelled"), (kept, "PROVIDER_ACCEPTED", None)]
    assert (dlq, retries) == ([], [])
    assert emulator_records(fakes, gone) == []
    assert gate(stack, kept) == SENDING and not cancel(stack, kept)

    replay: list[OutRecord] = []
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(items), replay))
    again, _, _ = decode(stack, replay)
    assert sorted((e.message_id, e.status.value) for e in again) == [
        (gone, "CANCELLED"), (kept, "PROVIDER_ACCEPTED")]
    assert emulator_records(fakes, gone) == []
    assert accepted_counts(fakes)[kept] == 1


def test_retry_pending_clears_the_gate_and_a_cancel_stops_the_next_attempt(
        stack: Settings, fakes: str, template: int) -> None:
    base = uuid.uuid4().int % 10**9
    mid = f"msg_retry_cancel_{base}"
    httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": True}).raise_for_status()
    try:
        out: list[OutRecord] = []
        run_main(send_flow(stack, Tier.P1, TestingSource(
            [kmsg(stack, api_record(mid, f"r{base}"), base)]), out))
    finally:
        httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": False}).raise_for_status()
    events, _, retries = decode(stack, out)
    assert [e.status.value for e in events] == ["RETRY_PENDING"]
    assert gate(stack, mid) is None
    assert cancel(stack, mid)

    [retry] = retries
    assert retry.not_before is not None
    assert retry.not_before - datetime.now(UTC) < timedelta(seconds=1)
    nxt: list[OutRecord] = []
    run_main(send_flow(stack, Tier.P1, TestingSource(
        [kmsg(stack, retry.model_dump_json(exclude_none=True).encode(), base + 1),
         TestingSource.PAUSE(timedelta(seconds=1))]), nxt))
    after, _, more = decode(stack, nxt)
    assert [(e.status.value, e.attempt) for e in after] == [("CANCELLED", 2)]
    assert more == []
    assert all(r.get("outcome") != "accepted" for r in emulator_records(fakes, mid))
