"""A 429 with ``Retry-After`` from the first SMS account (memory ports, 1 and 2 workers):
P0's next attempt goes to the alternate account at once (docs/design.md, "Retry budgets"),
not after the first account's wait, and is accepted there; the throttling account's wait
travels with the retry record (``provider_waits``). How a real 429 becomes
``rate_limited`` with its wait is the adapters' (``test_twilio_classification.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest

from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.memory import Answer
from notiflow.adapters.providers.base import Outcome
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import IngestRecord, StatusEvent
from tests.flow.conftest import RUNNERS, MemorySend, decode, kmsg, record

pytestmark = pytest.mark.flow

RETRY_AFTER_S = 5.0


def run(mem: MemorySend, runner: str, value: bytes,
        offset: int) -> tuple[list[StatusEvent], list[IngestRecord], list[OutRecord]]:
    from bytewax.testing import TestingSource

    out: list[OutRecord] = []
    RUNNERS[runner](mem.flow(TestingSource([kmsg(mem.settings, value, offset, Tier.P0)]),
                             out))
    events, _, retries = decode(mem.settings, out)
    return events, retries, out


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p0_goes_to_the_alternate_at_once(memory_send: Callable[..., MemorySend],
                                          runner: str) -> None:
    mem = memory_send(Tier.P0)
    mem.state.provider("twilio").default = Answer(Outcome.TRANSIENT, "rate_limited",
                                                  "http_429", RETRY_AFTER_S)
    base = uuid.uuid4().int % 10**8
    events, retries, out = run(mem, runner, record("th1", tier="P0"), base)
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
    [raw] = [r.value for r in out if r.topic == mem.settings.ingest_topic("SMS", Tier.P0)]
    events, retries, _ = run(mem, runner, raw, base + 1)
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
    assert events[0].attempt_detail is not None
    assert events[0].attempt_detail.provider_id == "vonage" and not retries
