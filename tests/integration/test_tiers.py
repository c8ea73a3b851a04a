"""Tier isolation on the real stack: P0 keeps its SLA during a P3 flood, a slow channel does
not stall the others, an acknowledged opt-out applies at once, and a Redis outage pauses
P2/P3 while P0 keeps sending."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import orjson
import pytest
from cassandra.cluster import Session

from notiflow.adapters.kafka_io import OutRecord
from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Tier
from tests.helpers import fresh_phone, hold, message_row, produce, received_at, report, wait_for
from tests.integration.conftest import RedisServer, ready
from tests.integration.test_pipeline import ids_of

pytestmark = pytest.mark.integration

P3_QUIET_S = 2.0
"""How long P3 must stay unsent while Redis is down."""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def template(api: str, token: str, channel: str, template_id: str, body: str,
             subject: str | None = None) -> int:
    r = httpx.post(f"{api}/v1/templates", headers=bearer(token), json={
        "template_id": template_id, "channel": channel, "body": body, "subject": subject})
    assert r.status_code in (200, 201), r.text
    return int(r.json()["version"])


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


API_MS: list[int] = []


def post_messages(api: str, token: str, bodies: list[dict[str, Any]],
                  rate: float) -> list[tuple[str, float]]:
    """POST at a steady rate; returns (message_id, accepted_at epoch seconds)."""
    out = []
    with httpx.Client(base_url=api, timeout=30) as client:
        start = time.monotonic()
        for i, body in enumerate(bodies):
            hold(start + i / rate - time.monotonic())
            t0 = time.monotonic()
            r = client.post("/v1/messages", json=body, headers={
                **bearer(token), "Idempotency-Key": uuid.uuid4().hex})
            API_MS.append(round((time.monotonic() - t0) * 1000))
            assert r.status_code == 202, r.text
            doc = r.json()
            out.append((doc["message_id"], datetime.fromisoformat(doc["accepted_at"]).timestamp()))
    return out


@pytest.mark.solo
def test_p0_keeps_its_sla_during_a_p3_flood(isolated, tokens: dict[str, str],
                                             fakes: str, capsys) -> None:
    rates = json.dumps({"twilio": 200, "sendgrid": 1000, "fcm": 10000})
    httpx.post(f"{fakes}/_admin/reset").raise_for_status()
    iso = isolated("flood", NOTIFLOW_PROVIDER_RATES=rates, NOTIFLOW_VONAGE__API_KEY="")
    api = iso.api()
    iso.flow(Tier.P0)
    iso.flow(Tier.P3)
    version = template(api, tokens["acme"], "SMS", "otp", "Your code is {{ code }}")

    def otp(i: int, tag: str) -> dict[str, Any]:
        return {"channel": "SMS", "tier": "P0", "category": "otp",
                "recipient": f"+1415555{i:04d}", "template_id": "otp",
                "template_version": version, "variables": {"code": f"{tag}-{i}"}}

    warm = {m for m, _ in post_messages(api, tokens["acme"],
                                        [otp(9000 + i, "warm") for i in range(20)], rate=20)}
    wait_for(lambda: warm <= set(received_at(fakes, ids=warm)), timeout=60,
             what="P0 warm-up (P0 workers are kept warm in production)")

    n = 20_000
    topic = iso.settings.ingest_topic("SMS", Tier.P3)
    records = [OutRecord(topic, None, orjson.dumps({
        "channel": "SMS", "tier": "P3", "tenant_id": "acme", "category": "marketing",
        "recipient": f"+1{202 + i // 10_000 * 213}555{i % 10_000:04d}", "template_id": "otp",
        "template_version": version, "variables": {"code": f"{i:06d}"}})) for i in range(n)]
    started, queued_at = time.monotonic(), time.time()
    p3_ids = set(ids_of(iso.settings, Tier.P3, produce(iso.settings, records)))
    queued_s = time.monotonic() - started

    def p3_sent() -> int:
        return len(p3_ids & set(received_at(fakes)))

    wait_for(p3_sent, what="the P3 campaign to start sending")

    p0 = post_messages(api, tokens["acme"], [otp(i, "p0") for i in range(50)], rate=20)
    p0_ids = {m for m, _ in p0}
    wait_for(lambda: p0_ids <= set(received_at(fakes, ids=p0_ids)), timeout=60,
             what="every P0 message at the provider")
    seen = received_at(fakes)
    p0_lat = sorted((seen[m] - at) * 1000 for m, at in p0)
    p3_lat = sorted((seen[m] - queued_at) * 1000 for m in p3_ids if m in seen)
    backlog = n - len(p3_lat)
    api = sorted(API_MS[-len(p0):])
    report(capsys, f"queued {n} P3 in {queued_s:.1f}s; P3 backlog when P0 finished: {backlog}\n"
          f"P0 acceptance→provider ms: p50={pct(p0_lat, 50):.0f} p99={pct(p0_lat, 99):.0f} "
          f"max={p0_lat[-1]:.0f} (API round trip p50={pct(api, 50):.0f} "
          f"p99={pct(api, 99):.0f})\n"
          f"P3 acceptance→provider ms (the {len(p3_lat)} sent so far): "
          f"p50={pct(p3_lat, 50):.0f} p99={pct(p3_lat, 99):.0f}")
    assert backlog >= 10_000, "the P3 backlog drained before P0 was measured"
    assert pct(p0_lat, 99) < 1000


@pytest.mark.solo
def test_slow_sms_does_not_stall_email_and_push(isolated, tokens: dict[str, str],
                                                fakes: str, capsys) -> None:
    iso = isolated("channels")
    api = iso.api()
    iso.flow(Tier.P0)
    t = tokens["acme"]
    v_sms = template(api, t, "SMS", "otp", "Your code is {{ code }}")
    v_mail = template(api, t, "EMAIL", "otp-mail", "Your code is {{ code }}", "Your code")
    v_push = template(api, t, "PUSH", "otp-push", "Your code is {{ code }}", "Sign in")
    for knobs in ({"latency_ms": 5000}, {"outage": True}):
        httpx.post(f"{fakes}/_admin/twilio/config", json=knobs).raise_for_status()
        try:
            sms = [{"channel": "SMS", "tier": "P0", "category": "otp",
                    "recipient": f"+1202555{i:04d}", "template_id": "otp",
                    "template_version": v_sms, "variables": {"code": f"s{i}"}}
                   for i in range(300)]
            with httpx.Client(base_url=api, timeout=30) as c:
                for body in sms:
                    assert c.post("/v1/messages", json=body, headers={
                        **bearer(t), "Idempotency-Key": uuid.uuid4().hex}).status_code == 202
            others = []
            for i in range(20):
                others.append({"channel": "EMAIL", "tier": "P0", "category": "otp",
                               "recipient": f"user{i}.{uuid.uuid4().hex[:6]}@example.com",
                               "template_id": "otp-mail", "template_version": v_mail,
                               "variables": {"code": f"e{i}"}})
                others.append({"channel": "PUSH", "tier": "P0", "category": "otp",
                               "recipient": {"device_token": f"fcm-{uuid.uuid4().hex}-{i:04d}",
                                             "platform": "android"},
                               "template_id": "otp-push", "template_version": v_push,
                               "variables": {"code": f"p{i}"}})
            sent = post_messages(api, t, others, rate=20)
            ids = {m for m, _ in sent}

            def arrived(ids: set[str] = ids) -> dict[str, float] | None:
                seen = received_at(fakes, ("sendgrid", "fcm"))
                return seen if ids <= set(seen) else None

            seen = wait_for(arrived, timeout=30, what="email and push at their providers")
            lat = sorted((seen[m] - at) * 1000 for m, at in sent)
            report(capsys, f"SMS {knobs}: email+push latency ms p50={pct(lat, 50):.0f} "
                  f"p99={pct(lat, 99):.0f} max={lat[-1]:.0f}")
            assert pct(lat, 99) < 1000
        finally:
            httpx.post(f"{fakes}/_admin/twilio/config",
                       json={"latency_ms": 0, "outage": False}).raise_for_status()


def test_acknowledged_opt_out_applies_to_the_next_marketing_message(
        api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p3: ManagedProcess, cql: Session) -> None:
    who = fresh_phone()
    t = tokens["acme"]
    r = httpx.put(f"{api}/v1/recipients/{who}/preferences", headers=bearer(t), json={
        "opt_outs": [{"channel": "SMS", "category": "marketing"}]})
    assert r.status_code == 200, r.text
    ids = []
    for category in ("marketing", "account"):
        r = httpx.post(f"{api}/v1/messages", headers={**bearer(t),
                                                      "Idempotency-Key": uuid.uuid4().hex},
                       json={"channel": "SMS", "tier": "P3", "category": category,
                             "recipient": who, "template_id": "otp",
                             "template_version": otp_template["acme"],
                             "variables": {"code": uuid.uuid4().hex[:6]}})
        assert r.status_code == 202, r.text
        ids.append(r.json()["message_id"])
    final = {"SUPPRESSED", "PROVIDER_ACCEPTED", "SENT", "DELIVERED"}
    wait_for(lambda: all((message_row(cql, m) or {}).get("status") in final for m in ids),
             what="both messages decided")
    marketing, account = (message_row(cql, m) for m in ids)
    assert (marketing["status"], marketing["reason"]) == ("SUPPRESSED", "opted_out")
    assert account["status"] != "SUPPRESSED"


def test_redis_outage_p0_continues_p3_pauses_then_resumes(
        isolated, tokens: dict[str, str], otp_template: dict[str, int], fakes: str,
        private_redis: RedisServer) -> None:
    iso = isolated("redis-down", NOTIFLOW_REDIS_URL=private_redis.url)
    iso.flow(Tier.P0)
    iso.flow(Tier.P3)
    version = otp_template["acme"]

    def batch(tier: Tier, tag: str) -> list[str]:
        topic = iso.settings.ingest_topic("SMS", tier)
        recs = [OutRecord(topic, None, orjson.dumps({
            "channel": "SMS", "tier": tier.value, "tenant_id": "acme", "category": "account",
            "recipient": f"+1415555{uuid.uuid4().int % 10_000:04d}", "template_id": "otp",
            "template_version": version, "variables": {"code": f"{tag}-{i}"}}))
                for i in range(20)]
        return ids_of(iso.settings, tier, produce(iso.settings, recs))

    def arrived(ids: list[str]) -> set[str]:
        seen = received_at(fakes)
        return {i for i in ids if i in seen}

    before = batch(Tier.P0, "a") + batch(Tier.P3, "a")
    wait_for(lambda: len(arrived(before)) == len(before), what="sends before the outage")

    private_redis.stop(kill=True)
    p0_down, p3_down = batch(Tier.P0, "b"), batch(Tier.P3, "b")
    wait_for(lambda: len(arrived(p0_down)) == len(p0_down), timeout=30,
             what="P0 sending while Redis is down")
    hold(P3_QUIET_S)
    assert arrived(p3_down) == set(), "P3 sent while Redis was down"

    private_redis.start()
    wait_for(lambda: len(arrived(p3_down)) == len(p3_down), timeout=60,
             what="P3 resuming after Redis is back")
    everything = before + p0_down + p3_down
    assert arrived(everything) == set(everything)


def test_shared_baseline_mode_sends_every_tier(isolated, tokens: dict[str, str],
                                               otp_template: dict[str, int],
                                               fakes: str) -> None:
    """``--mode shared``: the API writes every tier to one topic and one flow sends them all
    (kept only as the benchmark's baseline)."""
    iso = isolated("shared", NOTIFLOW_MODE="shared")
    api = iso.api()
    flow = iso.start("send-shared", ["flow", "send", "--mode", "shared", "--recovery-dir",
                                     str(iso.recovery / "send-shared")])
    flow.wait_until(lambda: ready(flow), timeout=60)
    bodies = [{"channel": "SMS", "tier": tier, "category": "account",
               "recipient": f"+1312555{uuid.uuid4().int % 10_000:04d}", "template_id": "otp",
               "template_version": otp_template["acme"], "variables": {"code": f"{tier}{i}"}}
              for i in range(5) for tier in ("P0", "P1", "P2", "P3")]
    sent = post_messages(api, tokens["acme"], bodies, rate=50)
    ids = {m for m, _ in sent}
    wait_for(lambda: ids <= set(received_at(fakes)), timeout=60,
             what="every tier sent by the shared flow")
    from tests.helpers import read_topic

    topics = {m.topic() for m in read_topic(iso.settings, iso.settings.shared_topic)}
    assert topics == {iso.settings.shared_topic}
