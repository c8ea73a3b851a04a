"""P3 email through the send flow with bulk batching (TestingSource/TestingSink, 1 and 2
workers; Redis, Cassandra and the SendGrid emulator real): messages share Mail Send requests,
and each still ends with its own event, its own provider message id and its own outcome."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.testing import TestingSource

from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, bound, decode, put_template, send_flow
from tests.helpers import emulator_records

pytestmark = pytest.mark.flow

N = 60
BAD = {7, 31}
"""Rows whose address SendGrid refuses (the emulator's ``invalid.example.com``)."""


@pytest.fixture(scope="module")
def mail_template(stack: Settings) -> int:
    """Template ``flow-mail`` version 1 (email) for tenant mkt."""
    return put_template(stack, "mkt", "flow-mail", "EMAIL",
                        "Hello {{ name }}, the sale starts now.", "Winter sale, {{ name }}")


def sendgrid_only(stack: Settings) -> Settings:
    """The session's settings with SendGrid as the only email route (P3 would otherwise take
    the cheaper SMTP relay)."""
    return stack.model_copy(update={"smtp": stack.smtp.model_copy(update={"password": None})})


def item(settings: Settings, n: int, base: int) -> KafkaSourceMessage:
    domain = "invalid.example.com" if n in BAD else "example.com"
    doc: dict[str, Any] = {
        "channel": "EMAIL", "tier": "P3", "tenant_id": "mkt", "category": "marketing",
        "recipient": f"reader{base}-{n}@{domain}", "template_id": "flow-mail",
        "template_version": 1, "variables": {"name": f"Ana {n}"},
        "message_id": f"msg_{base}_{n}", "idempotency_key": f"bulk-{base}-{n}",
        "accepted_at": datetime.now(UTC).isoformat()}
    topic, value = settings.ingest_topic("EMAIL", Tier.P3), orjson.dumps(doc)
    return KafkaSourceMessage(key=None, value=value, topic=topic,
                              headers=bound(settings, topic, value), latency=None,
                              offset=base + n, partition=0,
                              timestamp=(1, int(datetime.now(UTC).timestamp() * 1000)))


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p3_email_shares_requests_and_keeps_one_outcome_per_message(
        stack: Settings, fakes: str, mail_template: int, runner: str) -> None:
    settings = sendgrid_only(stack)
    assert settings.policy(Tier.P3).provider_batch > 1
    base = uuid.uuid4().int % 10**9
    before = httpx.get(f"{fakes}/_admin/sendgrid/stats").json()["requests"]
    out: list[OutRecord] = []
    RUNNERS[runner](send_flow(settings, Tier.P3, TestingSource(
        [item(settings, n, base) for n in range(N)], batch_size=N), out))
    events, dlq, retries = decode(settings, out)
    requests = httpx.get(f"{fakes}/_admin/sendgrid/stats").json()["requests"] - before

    final = {e.message_id: e for e in events if e.status.value != "SCHEDULED"}
    assert dlq == [] and retries == [] and len(final) == N
    accepted = {m for m, e in final.items() if e.status.value == "PROVIDER_ACCEPTED"}
    failed = {m for m, e in final.items() if e.status.value == "FAILED"}
    assert failed == {f"msg_{base}_{n}" for n in BAD}
    assert all(final[m].reason == "invalid_recipient" for m in failed)
    assert len(accepted) == N - len(BAD)
    details = [final[m].attempt_detail for m in accepted]
    pids = {d.provider_message_id for d in details if d is not None}
    assert len(pids) == len(accepted) and all("#" in str(p) for p in pids)
    assert requests <= N // 4, f"{requests} requests for {N} messages"

    for n in range(N):
        mid = f"msg_{base}_{n}"
        recs = [r for r in emulator_records(fakes, mid, ("sendgrid",))
                if r["outcome"] == "accepted"]
        assert len(recs) == (0 if n in BAD else 1), mid
        if recs:
            assert recs[0]["body"] == f"Hello Ana {n}, the sale starts now."
            assert recs[0]["subject"] == f"Winter sale, Ana {n}"
