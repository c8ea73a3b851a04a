"""Provider outage: the primary SMS vendor's breaker opens within five failures, traffic fails
over to the secondary with nothing lost, and the breaker half-opens and closes once the
outage ends."""

from __future__ import annotations

import uuid
from collections import Counter

import httpx
import orjson
import pytest

from notiflow.adapters.kafka_io import OutRecord
from notiflow.schemas.enums import Tier
from tests.helpers import Placer, emulator_records, hold, report, wait_for
from tests.integration.test_pipeline import ids_of

pytestmark = pytest.mark.integration


def test_primary_outage_fails_over_and_breaker_recovers(isolated, otp_template: dict[str, int],
                                                        fakes: str, capsys) -> None:
    iso = isolated("failover")
    iso.flow(Tier.P0)
    topic = iso.settings.ingest_topic("SMS", Tier.P0)
    version = otp_template["acme"]

    placer = Placer(iso.settings)

    def send(n: int, tag: str, rate: float) -> list[str]:
        ids = []
        for i in range(n):
            rec = OutRecord(topic, None, orjson.dumps({
                "channel": "SMS", "tier": "P0", "tenant_id": "acme", "category": "account",
                "recipient": f"+1415555{uuid.uuid4().int % 10_000:04d}", "template_id": "otp",
                "template_version": version, "variables": {"code": f"{tag}{i}"}}))
            ids += ids_of(iso.settings, Tier.P0, placer.send([rec]))
            hold(1 / rate)
        return ids

    def by_provider(ids: list[str]) -> dict[str, Counter[str]]:
        wanted = set(ids)
        out: dict[str, Counter[str]] = {"twilio": Counter(), "vonage": Counter()}
        for rec in emulator_records(fakes):
            if rec.get("message_id") in wanted:
                out[rec["provider"]][rec["outcome"]] += 1
        return out

    def delivered(ids: list[str]) -> set[str]:
        return {r["message_id"] for r in emulator_records(fakes)
                if r.get("message_id") in set(ids) and r.get("outcome") == "accepted"}

    before = send(10, "a", 20)
    wait_for(lambda: delivered(before) == set(before), what="traffic before the outage")
    assert by_provider(before)["twilio"]["accepted"] == 10, "P0 prefers the reliable vendor"

    httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": True}).raise_for_status()
    try:
        during = send(60, "b", 20)
        wait_for(lambda: delivered(during) == set(during), timeout=60,
                 what="every message delivered during the outage")
        seen = by_provider(during)
        failures = sorted(r["received_at"] for r in emulator_records(fakes, providers=("twilio",))
                          if r.get("message_id") in set(during))
        open_for = iso.settings.scaled(iso.settings.breaker.open_for).total_seconds()
        opened = failures[:5]
        probes = failures[5:]
        gaps = [b - a for a, b in zip([opened[-1], *probes], probes, strict=False)]
        assert all(g >= open_for * 0.9 for g in gaps), (
            f"the breaker let more than 5 failures through before opening: {failures}")
        assert seen["vonage"]["accepted"] == len(during)
    finally:
        httpx.post(f"{fakes}/_admin/twilio/config", json={"outage": False}).raise_for_status()

    half_open = iso.settings.scaled(iso.settings.breaker.open_for).total_seconds()
    hold(half_open + 0.5)
    after = send(600, "c", 100)
    wait_for(lambda: delivered(after) == set(after), timeout=90, what="traffic after the outage")
    tail = by_provider(after[-60:])
    report(capsys, f"failover: the primary answered {len(opened)} failures before its breaker "
           f"opened, then {len(probes)} half-open probes during the outage; "
           f"{seen['vonage']['accepted']}/{len(during)} via the secondary; after recovery "
           f"{by_provider(after)['twilio']['accepted']}/{len(after)} back on the primary "
           f"(last 60: {tail['twilio']['accepted']})")
    assert tail["twilio"]["accepted"] >= 50, "the breaker did not close after the outage"

    everything = before + during + after
    counts = Counter(r["message_id"] for r in emulator_records(fakes)
                     if r.get("message_id") in set(everything) and r["outcome"] == "accepted")
    assert set(counts) == set(everything), "a message was lost"
    assert max(counts.values()) == 1, "an outage answer (503) is not ambiguous: no duplicates"
