"""A 429 with ``Retry-After`` from the first SMS account: P0's next attempt goes to the
alternate account at once (docs/design.md, "Retry budgets"), not after the first
account's wait, and is accepted there; the throttling account's wait travels with the retry
record (``provider_waits``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from bytewax.testing import TestingSource, run_main

from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings
from tests.flow.conftest import decode, kmsg, record, send_flow

pytestmark = pytest.mark.flow

RETRY_AFTER_S = 5.0


@pytest.fixture
def fresh_breakers(stack: Settings) -> Settings:
    """A namespace of its own: no route weight lowered by earlier throttles."""
    return stack.model_copy(update={
        "topic_prefix": f"{stack.topic_prefix}th{uuid.uuid4().hex[:6]}."})


@pytest.fixture
def twilio_throttles(fakes: str) -> Iterator[None]:
    url = f"{fakes}/_admin/twilio/config"
    httpx.post(url, json={"error_rate_429": 1.0,
                          "retry_after_s": RETRY_AFTER_S}).raise_for_status()
    yield
    httpx.post(url, json={"error_rate_429": 0.0, "retry_after_s": 1.0}).raise_for_status()


def run(settings: Settings, value: bytes, offset: int) -> tuple[list, list, list[OutRecord]]:
    out: list[OutRecord] = []
    run_main(send_flow(settings, Tier.P0, TestingSource(
        [kmsg(settings, value, offset, Tier.P0)]), out))
    events, _, retries = decode(settings, out)
    return events, retries, out


def test_p0_goes_to_the_alternate_at_once(fresh_breakers: Settings, fakes: str,
                                          template: int, twilio_throttles: None) -> None:
    base = uuid.uuid4().int % 10**8
    events, retries, out = run(fresh_breakers, record("th1", tier="P0"), base)
    [ev] = events
    assert ev.status is Status.RETRY_PENDING and ev.reason == "rate_limited"
    assert ev.attempt_detail is not None and ev.attempt_detail.provider_id == "twilio"
    [again] = retries
    assert again.attempt == 2 and again.avoid_provider == "twilio"
    assert again.not_before is not None
    assert again.not_before - ev.occurred_at < timedelta(seconds=1)
    assert again.provider_waits is not None
    assert again.provider_waits["twilio"] - ev.occurred_at >= timedelta(
        seconds=RETRY_AFTER_S - 0.5)
    [raw] = [r.value for r in out if r.topic == fresh_breakers.ingest_topic("SMS", Tier.P0)]
    events, retries, _ = run(fresh_breakers, raw, base + 1)
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
    assert events[0].attempt_detail is not None
    assert events[0].attempt_detail.provider_id == "vonage" and not retries
