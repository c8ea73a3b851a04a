"""Producer quarantine on the real stack: 5,000 invalid records from tenant globex interleaved
with acme's P1 traffic quarantine globex (its records in the DLQ with their reasons), never
halt the P1 send flow, and leave acme's latency to the provider where it was without them."""

from __future__ import annotations

import statistics
import time

import orjson
import pytest

from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Tier
from tests.helpers import hold, produce, read_topic, received_at, report, wait_for
from tests.integration.test_pipeline import direct, ids_of

pytestmark = [pytest.mark.integration, pytest.mark.solo]

INVALID_PER_VALID = 50
VALID = 100


def invalid(topic: str, i: int) -> OutRecord:
    """A globex record the parser refuses (its recipient is not a phone number)."""
    return OutRecord(topic, None, orjson.dumps({
        "channel": "SMS", "tier": "P1", "tenant_id": "globex", "category": "account",
        "recipient": f"not-a-phone-{i}", "template_id": "otp", "template_version": 1,
        "variables": {"code": "000000"}}))


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def test_one_tenants_invalid_records_quarantine_it_without_halting_the_tier(
        isolated, otp_template: dict[str, int], fakes: str, capsys) -> None:
    iso = isolated("quarantine")
    flow = iso.flow(Tier.P1)
    settings = iso.settings
    topic = settings.ingest_topic("SMS", Tier.P1)

    def paced(flood: bool) -> dict[str, float]:
        """``VALID`` acme records, one every 40 ms (with ``INVALID_PER_VALID`` globex records
        each when ``flood``); message id → when its produce began."""
        sent: dict[str, float] = {}
        for i in range(VALID):
            batch = [direct(settings, Tier.P1, otp_template["acme"])]
            if flood:
                batch += [invalid(topic, i * INVALID_PER_VALID + k)
                          for k in range(INVALID_PER_VALID)]
            began = time.time()
            placed = produce(settings, batch)
            sent[ids_of(settings, Tier.P1, placed[:1])[0]] = began
            hold(began + 0.04 - time.time())
        return sent

    def latencies(sent: dict[str, float]) -> list[float]:
        got = wait_for(lambda: (lambda r: r if set(sent) <= r.keys() else None)(
            received_at(fakes)), timeout=120, what="acme's messages sent")
        return [got[m] - t for m, t in sent.items()]

    alone = latencies(paced(flood=False))
    flooded = latencies(paced(flood=True))
    wait_for(lambda: "PRODUCER_QUARANTINE" in flow.log_path.read_text(errors="replace"),
             timeout=30, what="the quarantine alert")
    log = flow.log_path.read_text(errors="replace")
    assert flow.alive, flow.tail()
    assert "DLQ_LIMIT_BREACH" not in log
    assert "source=tenant:globex" in log

    def dead_letters() -> list[dict[str, object]]:
        return [orjson.loads(m.value()) for m in read_topic(settings, settings.dlq_topic(Tier.P1))]

    letters = wait_for(lambda: (lambda d: d if len(d) >= VALID * INVALID_PER_VALID else None)(
        [d for d in dead_letters() if d.get("tenant_id") == "globex"]), timeout=60,
        what="globex's records in the P1 DLQ")
    assert len(letters) == VALID * INVALID_PER_VALID
    assert all(str(d["reason"]).startswith("invalid record: recipient") for d in letters)
    report(capsys, f"quarantine: {len(letters):,} globex records dead-lettered, no halt; acme P1 "
           f"to provider p50/p99 alone {statistics.median(alone) * 1000:.0f}/"
           f"{p99(alone) * 1000:.0f} ms, during the flood "
           f"{statistics.median(flooded) * 1000:.0f}/{p99(flooded) * 1000:.0f} ms")
    assert statistics.median(flooded) <= 1.5 * statistics.median(alone) + 0.1
    assert p99(flooded) <= max(2 * p99(alone), p99(alone) + 1.0)
